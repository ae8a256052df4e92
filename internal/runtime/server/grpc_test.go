package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/runtime/server"
)

// recordingListener keeps a copy of every byte its connections read and
// write.
type recordingListener struct {
	net.Listener
	mu            sync.Mutex
	read, written bytes.Buffer
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, l: l}, nil
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.l.read.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.l.mu.Lock()
	c.l.written.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

// frameTypes counts the HTTP/2 frames in b by type; b may start with the
// client's connection preface.
func frameTypes(t *testing.T, b []byte) map[byte]int {
	t.Helper()
	b = bytes.TrimPrefix(b, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	counts := map[byte]int{}
	for len(b) > 0 {
		if len(b) < 9 {
			t.Fatalf("%d bytes left, less than a frame header", len(b))
		}
		n := int(binary.BigEndian.Uint32(append([]byte{0}, b[:3]...)))
		counts[b[3]]++
		if len(b) < 9+n {
			t.Fatalf("frame of %d bytes cut at %d", n, len(b)-9)
		}
		b = b[9+n:]
	}
	return counts
}

// A call between runtimed and its Runtime Server is its request and its
// answer: no PING frame in either direction, which grpc-go's bandwidth
// estimation would send after each message received unless both ends set
// their windows, and no window update after the connection's first.
func TestRuntimeServerConnectionSendsNoPing(t *testing.T) {
	const framePing, frameWindowUpdate = 0x6, 0x8
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingListener{Listener: lis}
	g := server.NewGRPC(slog.New(slog.DiscardHandler), server.Services{})
	served := make(chan error, 1)
	go func() { served <- g.Server.Serve(rec) }()
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	health := healthpb.NewHealthClient(conn)
	for range 20 {
		if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	g.Server.Stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for dir, b := range map[string][]byte{"client to server": rec.read.Bytes(), "server to client": rec.written.Bytes()} {
		counts := frameTypes(t, b)
		if counts[framePing] != 0 {
			t.Errorf("%s: %d PING frames in 20 calls (frames by type: %v)", dir, counts[framePing], counts)
		}
		if counts[frameWindowUpdate] > 1 {
			t.Errorf("%s: %d WINDOW_UPDATE frames in 20 calls, want only the connection's first (frames by type: %v)", dir, counts[frameWindowUpdate], counts)
		}
		if counts[0] < 20 { // DATA: the test saw the calls
			t.Errorf("%s: %d DATA frames, want one per call at least (frames by type: %v)", dir, counts[0], counts)
		}
	}
}

// scriptedFunctions answers InvokeFunction by its input: "panic" panics,
// "missing" is an errdefs NotFound, anything else is echoed.
type scriptedFunctions struct {
	pb.UnimplementedFunctionRuntimeServer
}

func (scriptedFunctions) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	switch string(req.GetInput()) {
	case `"panic"`:
		panic("scripted")
	case `"missing"`:
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "scripted miss")
	}
	return &pb.InvokeFunctionResponse{Output: req.GetInput()}, nil
}

// Every unary call passes through recovery, code translation and, for
// InvokeFunction, the metrics, in that order: a panic is Internal and is
// not counted, an error category becomes its code and its result label,
// an answer is counted "ok" with its duration, and other methods (the
// scrape itself) are not counted.
func TestUnaryInterceptor(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	m := server.NewMetrics(nil)
	g := server.NewGRPC(slog.New(slog.DiscardHandler), server.Services{Functions: scriptedFunctions{}, Metrics: m})
	served := make(chan error, 1)
	go func() { served <- g.Server.Serve(lis) }()
	defer func() {
		g.Server.Stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fns := pb.NewFunctionRuntimeClient(conn)
	for _, c := range []struct {
		input string
		code  codes.Code
	}{{`"a"`, codes.OK}, {`"panic"`, codes.Internal}, {`"missing"`, codes.NotFound}, {`"b"`, codes.OK}, {`"panic"`, codes.Internal}} {
		resp, err := fns.InvokeFunction(t.Context(), &pb.InvokeFunctionRequest{Input: []byte(c.input)})
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.input, err, c.code)
		}
		if c.code == codes.OK && string(resp.GetOutput()) != c.input {
			t.Errorf("%s: answered %q", c.input, resp.GetOutput())
		}
	}
	mfs, err := metricsrpc.Scrape(t.Context(), conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metricsrpc.Scrape(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stoke_runtime_invocations_total", map[string]string{"result": "ok"}, 2},
		{"stoke_runtime_invocation_duration_seconds", map[string]string{"result": "ok"}, 2},
		{"stoke_runtime_invocations_total", map[string]string{"result": "not_found"}, 1},
		{"stoke_runtime_invocation_duration_seconds", map[string]string{"result": "not_found"}, 1},
		{"stoke_runtime_invocations_in_flight", nil, 0},
	} {
		if got, ok := metricValue(mfs, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, result := range []string{"internal", "unknown"} {
		if got, ok := metricValue(mfs, "stoke_runtime_invocations_total", map[string]string{"result": result}); ok {
			t.Errorf("a panic was counted as %q: %v", result, got)
		}
	}
}
