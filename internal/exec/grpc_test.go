package exec_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
)

// serveExec serves the Exec service over a local executor on a Unix
// socket, with the server options given, and returns a connection to it.
func serveExec(t *testing.T, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	l := exec.NewLocal(exec.LocalConfig{Targets: dirTargets{dir: t.TempDir(), ended: make(chan struct{})}})
	t.Cleanup(l.Close)
	sock := filepath.Join(t.TempDir(), "exec.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(opts...)
	pb.RegisterExecServer(s, exec.NewGRPCServer(l))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() { s.Stop(); <-done })
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// plainCat runs cat through the generated stub alone (grpc-go's proto
// codec), as a client outside Stoke would, and returns its stdout.
func plainCat(ctx context.Context, conn *grpc.ClientConn, in []byte) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewExecClient(conn).Exec(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&pb.ExecRequest{Frame: &pb.ExecRequest_Start{Start: &pb.ExecStart{RunUid: "run", Command: []string{"cat"}, Stdin: true}}}); err != nil {
		return nil, err
	}
	sent := make(chan error, 1)
	go func() {
		for p := in; len(p) > 0; {
			k := min(len(p), 50_000) // not the server's frame size
			if err := stream.Send(&pb.ExecRequest{Frame: &pb.ExecRequest_Stdin{Stdin: p[:k]}}); err != nil {
				sent <- err
				return
			}
			p = p[k:]
		}
		sent <- stream.Send(&pb.ExecRequest{Frame: &pb.ExecRequest_StdinClose{StdinClose: &pb.ExecStdinClose{}}})
	}()
	var out []byte
	for {
		m, err := stream.Recv()
		if err != nil {
			return out, err
		}
		out = append(out, m.GetStdout()...)
		if exit := m.GetExit(); exit != nil {
			if exit.GetExitCode() != 0 {
				return out, errors.New("cat failed")
			}
			return out, <-sent
		}
	}
}

// The Exec stream speaks protobuf whichever codec each end uses: Stoke's
// (data frames left in the receive buffers) or grpc-go's.
func TestGRPCCodecs(t *testing.T) {
	in := make([]byte, 3<<20+123)
	_, _ = rand.Read(in)
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	for _, server := range []struct {
		name string
		opts []grpc.ServerOption
	}{{"stoke server codec", []grpc.ServerOption{exec.ServerCodec()}}, {"grpc server codec", nil}} {
		conn := serveExec(t, server.opts...)
		out, _, exit, err := exectest.Collect(ctx, exec.NewGRPCClient(conn), exec.Request{RunUID: "run", Command: []string{"cat"}, Stdin: true}, bytes.NewReader(in))
		if err != nil || exit.Code != 0 || out != string(in) {
			t.Errorf("%s, stoke client: %d of %d bytes back, exit %+v, %v", server.name, len(out), len(in), exit, err)
		}
		raw, err := plainCat(ctx, conn, in)
		if err != nil && !errors.Is(err, io.EOF) || !bytes.Equal(raw, in) {
			t.Errorf("%s, grpc-go client: %d of %d bytes back, %v", server.name, len(raw), len(in), err)
		}
	}
}
