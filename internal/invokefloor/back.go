package invokefloor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runtime/server"
)

// backService is executor.v1's FunctionRuntime reduced to the worker's
// round trip: no registration, state, deadline or scan for leftovers.
type backService struct {
	pb.UnimplementedFunctionRuntimeServer
	worker *Worker
}

func (s *backService) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	out, err := s.worker.Call(req.GetInput())
	switch {
	case errors.Is(err, errNewline):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &pb.InvokeFunctionResponse{Registration: req.GetRegistration(), InvocationId: req.GetInvocationId(),
		Output: out, ContentType: req.GetContentType()}, nil
}

// ServeBack serves worker's round trip as FunctionRuntime/InvokeFunction on
// the Unix socket at path, with the Runtime Server's transport options,
// until ctx ends. ready runs once the socket listens.
func ServeBack(ctx context.Context, path string, worker *Worker, ready func()) error {
	lis, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	s := grpc.NewServer(server.TransportOptions()...)
	pb.RegisterFunctionRuntimeServer(s, &backService{worker: worker})
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	ready()
	select {
	case err := <-errc:
		return fmt.Errorf("serving %s: %w", path, err)
	case <-ctx.Done():
		s.Stop()
		<-errc
		return nil
	}
}

// BackConfig is the back process's: its socket and its worker's handler.
type BackConfig struct {
	Socket, Python, HandlerDir, Module string
}

// RunBack starts the worker and serves it on cfg.Socket until ctx ends,
// writing "ready" to stdout once the socket listens.
func RunBack(ctx context.Context, cfg BackConfig, stdout io.Writer) error {
	worker, err := StartWorker(cfg.Python, cfg.HandlerDir, cfg.Module)
	if err != nil {
		return err
	}
	defer worker.Close()
	return ServeBack(ctx, cfg.Socket, worker, func() { fmt.Fprintln(stdout, readyLine) })
}
