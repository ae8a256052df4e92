package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// NewGRPCServer serves the executor.v1 Exec service over x. Its errors are
// errdefs categories, translated by the server's interceptor.
func NewGRPCServer(x Executor) pb.ExecServer { return &grpcServer{x: x} }

type grpcServer struct {
	pb.UnimplementedExecServer
	x Executor
}

func (g *grpcServer) Exec(stream pb.Exec_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("exec: first frame: %w", err)
	}
	start := first.GetStart()
	if start == nil {
		return errdefs.InvalidArgument("frame", "the first frame must be start")
	}
	req := Request{
		RunUID: start.GetRunUid(), RegistrationID: start.GetRegistrationId(), Command: start.GetCommand(),
		TTY: start.GetTty(), Stdin: start.GetStdin(), Env: start.GetEnv(),
		Attach: start.GetAttach(), StdinOnce: start.GetStdinOnce(), ControlOnly: start.GetControlOnly(),
		Size: TermSize{Width: clamp16(start.GetSize().GetWidth()), Height: clamp16(start.GetSize().GetHeight())},
	}
	sess, err := g.x.Start(stream.Context(), req)
	if err != nil {
		return err
	}
	defer sess.Close()
	var sendMu sync.Mutex
	send := func(r *pb.ExecResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(r)
	}
	if err := send(&pb.ExecResponse{Frame: &pb.ExecResponse_Started{Started: &pb.ExecStarted{Pid: uint32(max(sess.Pid(), 0))}}}); err != nil {
		return err
	}
	// stdin goes through a synchronous pipe: a frame is received only
	// once the command took the previous one, so the stream's own flow
	// control holds back the client.
	stdin := newFramePipe()
	defer stdin.closeRead()
	go func() {
		f := inFrame{Message: new(pb.ExecRequest)}
		for {
			if err := stream.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				stdin.close(err)
				return
			}
			if f.Field != 0 { // stdin, in the received buffers
				if req.Stdin && stdin.put(f.pieces) != nil {
					// The reader may still hold the pieces: they
					// are left to the garbage collector.
					f.Data, f.pieces = nil, nil
					continue
				}
				f.free()
				continue
			}
			switch m := f.Message.(*pb.ExecRequest).GetFrame().(type) {
			case *pb.ExecRequest_Stdin: // through another codec
				if req.Stdin {
					_ = stdin.put([][]byte{m.Stdin})
				}
			case *pb.ExecRequest_StdinClose:
				stdin.close(nil)
			case *pb.ExecRequest_Resize:
				_ = sess.Resize(TermSize{Width: clamp16(m.Resize.GetWidth()), Height: clamp16(m.Resize.GetHeight())})
			case *pb.ExecRequest_Signal:
				_ = sess.Signal(syscall.Signal(m.Signal))
			}
		}
	}()
	streams := Streams{
		Stdout: frameWriter(func(p []byte) error {
			return send(&pb.ExecResponse{Frame: &pb.ExecResponse_Stdout{Stdout: p}})
		}),
		Stderr: frameWriter(func(p []byte) error {
			return send(&pb.ExecResponse{Frame: &pb.ExecResponse_Stderr{Stderr: p}})
		}),
	}
	if req.Stdin {
		streams.Stdin = stdin
	}
	exit, err := sess.Stream(stream.Context(), streams)
	if err != nil {
		return err
	}
	return send(&pb.ExecResponse{Frame: &pb.ExecResponse_Exit{Exit: &pb.ExecExit{ExitCode: int32(exit.Code), Signal: int32(exit.Signal)}}})
}

func clamp16(v uint32) uint16 { return uint16(min(v, 0xffff)) }

// frameWriter sends each Write as frames of at most bounds.ExecFrame.
type frameWriter func([]byte) error

func (f frameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), bounds.ExecFrame)
		if err := f(p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// NewGRPCClient returns an Executor that starts sessions over the
// executor.v1 Exec service at conn.
func NewGRPCClient(conn grpc.ClientConnInterface) Executor {
	return &grpcClient{c: pb.NewExecClient(conn)}
}

type grpcClient struct{ c pb.ExecClient }

func (c *grpcClient) Start(ctx context.Context, req Request) (Session, error) {
	// The stream outlives Start's ctx, which bounds the start only.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	stream, err := c.c.Exec(sctx, callCodec())
	if err != nil {
		cancel()
		return nil, fromGRPC(err)
	}
	err = stream.Send(&pb.ExecRequest{Frame: &pb.ExecRequest_Start{Start: &pb.ExecStart{
		RunUid: req.RunUID, RegistrationId: req.RegistrationID, Command: req.Command,
		Tty: req.TTY, Stdin: req.Stdin, Env: req.Env,
		Attach: req.Attach, StdinOnce: req.StdinOnce, ControlOnly: req.ControlOnly,
		Size: &pb.TerminalSize{Width: uint32(req.Size.Width), Height: uint32(req.Size.Height)},
	}}})
	var m *pb.ExecResponse
	if err == nil || errors.Is(err, io.EOF) { // EOF: the status comes with Recv
		m, err = stream.Recv()
	}
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("run %s: exec start: %w", req.RunUID, ctx.Err())
		}
		return nil, fromGRPC(err)
	}
	if m.GetStarted() == nil {
		cancel()
		return nil, errdefs.Errorf(errdefs.ErrInternal, "run %s: exec: the server's first frame was not started", req.RunUID)
	}
	return &grpcSession{req: req, stream: stream, cancel: cancel, pid: int(m.GetStarted().GetPid())}, nil
}

type grpcSession struct {
	req    Request
	pid    int
	stream pb.Exec_ExecClient
	cancel context.CancelFunc
	sendMu sync.Mutex
}

func (s *grpcSession) send(m *pb.ExecRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

func (s *grpcSession) Stream(ctx context.Context, st Streams) (Exit, error) {
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	if st.Stdin != nil && s.req.Stdin {
		go s.copyStdin(st.Stdin)
	}
	f := inFrame{Message: new(pb.ExecResponse)}
	var join []byte
	for {
		if err := s.stream.RecvMsg(&f); err != nil {
			if ctx.Err() != nil {
				return Exit{}, fmt.Errorf("run %s: exec session: %w", s.req.RunUID, ctx.Err())
			}
			if errors.Is(err, io.EOF) {
				return Exit{}, errdefs.Errorf(errdefs.ErrInternal, "run %s: exec: the stream ended without an exit", s.req.RunUID)
			}
			return Exit{}, fromGRPC(err)
		}
		if f.Field != 0 { // stdout or stderr, in the received buffers
			name, w := "stdout", st.Stdout
			if f.Field == stderrField {
				name = "stderr"
				if st.Stderr != nil {
					w = st.Stderr
				}
			}
			_, err := writeFrame(w, f.pieces, &join)
			f.free()
			if err != nil {
				return Exit{}, fmt.Errorf("run %s: exec: writing %s: %w", s.req.RunUID, name, err)
			}
			continue
		}
		// Frames other than data, and data through another codec.
		switch m := f.Message.(*pb.ExecResponse).GetFrame().(type) {
		case *pb.ExecResponse_Stdout:
			if _, err := st.Stdout.Write(m.Stdout); err != nil {
				return Exit{}, fmt.Errorf("run %s: exec: writing stdout: %w", s.req.RunUID, err)
			}
		case *pb.ExecResponse_Stderr:
			w := st.Stderr
			if w == nil {
				w = st.Stdout
			}
			if _, err := w.Write(m.Stderr); err != nil {
				return Exit{}, fmt.Errorf("run %s: exec: writing stderr: %w", s.req.RunUID, err)
			}
		case *pb.ExecResponse_Exit:
			return Exit{Code: int(m.Exit.GetExitCode()), Signal: int(m.Exit.GetSignal())}, nil
		}
	}
}

// writeFrame writes a frame that arrived in pieces as one Write: through
// WriteBuffers when w has it, else joined in *join when it fits a frame
// (bounds.ExecFrame), else piece by piece.
func writeFrame(w io.Writer, pieces [][]byte, join *[]byte) (int, error) {
	if bw, ok := w.(BuffersWriter); ok {
		return bw.WriteBuffers(pieces)
	}
	if len(pieces) == 1 {
		return w.Write(pieces[0])
	}
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	if total > bounds.ExecFrame {
		n := 0
		for _, p := range pieces {
			k, err := w.Write(p)
			n += k
			if err != nil {
				return n, err
			}
		}
		return n, nil
	}
	b := (*join)[:0]
	for _, p := range pieces {
		b = append(b, p...)
	}
	*join = b
	return w.Write(b)
}

// copyStdin sends stdin frames until EOF, then closes the command's stdin.
func (s *grpcSession) copyStdin(r io.Reader) {
	buf := make([]byte, bounds.ExecFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if s.send(&pb.ExecRequest{Frame: &pb.ExecRequest_Stdin{Stdin: buf[:n]}}) != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				_ = s.send(&pb.ExecRequest{Frame: &pb.ExecRequest_StdinClose{StdinClose: &pb.ExecStdinClose{}}})
			}
			return
		}
	}
}

func (s *grpcSession) Pid() int { return s.pid }

func (s *grpcSession) Resize(size TermSize) error {
	return s.send(&pb.ExecRequest{Frame: &pb.ExecRequest_Resize{Resize: &pb.TerminalSize{Width: uint32(size.Width), Height: uint32(size.Height)}}})
}

func (s *grpcSession) Signal(sig syscall.Signal) error {
	return s.send(&pb.ExecRequest{Frame: &pb.ExecRequest_Signal{Signal: int32(sig)}})
}

func (s *grpcSession) Close() error {
	s.cancel()
	return nil
}

// fromGRPC maps a peer's status back to a category. FailedPrecondition on
// exec means the Run is no longer running there (or the registration is
// stale): NotRunning.
func fromGRPC(err error) error {
	if status.Code(err) == codes.FailedPrecondition {
		return errdefs.Errorf(errdefs.ErrNotRunning, "%s", status.Convert(err).Message())
	}
	return errdefs.FromGRPC(err)
}
