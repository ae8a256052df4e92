// Package server is the gRPC edge of a Runtime Server: it serves the
// executor.v1 Runtime and FunctionRuntime implementations from
// internal/runtime with health checking, reflection and its Prometheus
// metrics (metrics.v1, on the same port), translates error categories to
// status codes once (in an interceptor), recovers panics, logs every call,
// and stops gracefully.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	metricsv1 "stoke.dev/stoke/api/metrics/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/metricsrpc"
)

// Services are the executor.v1 implementations one gRPC server exposes.
// Functions may be nil for a Runtime Server without function support.
type Services struct {
	Runtime   pb.RuntimeServer
	Functions pb.FunctionRuntimeServer
	// Exec, optional, serves exec sessions into live Runs.
	Exec pb.ExecServer
	// Metrics, optional, observes invocations and is served on the
	// metrics.v1 service.
	Metrics *Metrics
}

// GRPC is a configured gRPC server with its health service.
type GRPC struct {
	Server *grpc.Server
	Health *health.Server
	log    *slog.Logger
}

// Message and flow-control bounds of a connection to a Runtime Server.
const (
	// maxRecvMsg is room for the largest invocation input plus framing.
	maxRecvMsg = bounds.InvokeBody + 64<<10
	// maxSendMsg is room for the largest output with both captured streams.
	maxSendMsg = bounds.InvokeBody + 4*bounds.CapturedStream
	// streamWindow and connWindow are set on both ends. A window set
	// explicitly turns off grpc-go's bandwidth-delay estimation, which
	// answers a received message with a PING that the other end must
	// read and acknowledge: extra frames and wake-ups of both processes
	// on every call, for nothing on a local socket. A stream's window
	// holds the largest message, so that none waits for a window update.
	streamWindow = maxSendMsg
	connWindow   = 4 * streamWindow
	// connBuffer is a connection's read and write buffer: one exec frame
	// with its HTTP/2 and gRPC framing fits, so that a frame is one read
	// and one write.
	connBuffer = 2 * bounds.ExecFrame
)

// DialOptions are how a client (runtimed) connects to a Runtime Server:
// plaintext, as the server listens on a pod-local socket, with the
// server's windows, taking every message the server may send.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxSendMsg)),
		grpc.WithReadBufferSize(connBuffer),
		grpc.WithWriteBufferSize(connBuffer),
	}
}

// TransportOptions are the server side of DialOptions, which NewGRPC sets:
// message bounds, the windows and buffers both ends share, and how calls
// are run. The invoke benchmark's floor (internal/invokefloor) serves with
// them too.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvMsg),
		grpc.MaxSendMsgSize(maxSendMsg),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(connBuffer),
		grpc.WriteBufferSize(connBuffer),
		// A call runs on a goroutine that lives on, with the stack the
		// previous calls grew, instead of a new one that grows its stack
		// again on every call; when all are busy (exec and Wait streams)
		// a new goroutine takes the call as before.
		grpc.NumStreamWorkers(uint32(runtime.NumCPU())),
	}
}

// NewGRPC builds a gRPC server for svcs. Every RPC passes through panic
// recovery, then error translation and logging (and a unary one through
// the metrics, innermost).
func NewGRPC(log *slog.Logger, svcs Services, opts ...grpc.ServerOption) *GRPC {
	opts = append(append(TransportOptions(),
		grpc.UnaryInterceptor(unaryInterceptor(log, svcs.Metrics)),
		grpc.ChainStreamInterceptor(recoverStream(log), translateStream(log)),
		// Protobuf as grpc-go's own codec, but the Exec stream's data
		// frames are not copied out of the receive buffers.
		exec.ServerCodec(),
	), opts...)
	s := grpc.NewServer(opts...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	if svcs.Runtime != nil {
		pb.RegisterRuntimeServer(s, svcs.Runtime)
		h.SetServingStatus(pb.Runtime_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
	if svcs.Functions != nil {
		pb.RegisterFunctionRuntimeServer(s, svcs.Functions)
		h.SetServingStatus(pb.FunctionRuntime_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
	if svcs.Exec != nil {
		pb.RegisterExecServer(s, svcs.Exec)
		h.SetServingStatus(pb.Exec_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
	if svcs.Metrics != nil {
		metricsv1.RegisterMetricsServiceServer(s, metricsrpc.NewServer(svcs.Metrics.reg))
	}
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	return &GRPC{Server: s, Health: h, log: log}
}

// Serve serves on lis until ctx ends, then marks every service NOT_SERVING,
// stops accepting, and waits up to grace for RPCs in flight before forcing
// them closed. drain runs between the two, to end the work that RPCs are
// waiting on. Serve returns nil after a requested stop.
func (g *GRPC) Serve(ctx context.Context, lis net.Listener, grace time.Duration, drain func()) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Server.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("grpc serve: %w", err)
	case <-ctx.Done():
	}
	g.Health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		g.Server.GracefulStop()
		close(stopped)
	}()
	if drain != nil {
		drain()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		g.log.Warn("graceful stop timed out; closing remaining RPCs", "grace", grace)
		g.Server.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc serve: %w", err)
	}
	return nil
}

// unaryInterceptor is recovery, translation and metrics (m may be nil)
// in one interceptor, in that order from the outside, as the stream
// interceptors are chained: grpc-go's chain of three made two closures
// and three calls more on every InvokeFunction. A panic is answered
// Internal, and is neither logged as a call nor counted as an invocation.
func unaryInterceptor(log *slog.Logger, m *Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in RPC", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		start := time.Now()
		if m != nil && info.FullMethod == pb.FunctionRuntime_InvokeFunction_FullMethodName {
			resp, err = m.observeInvoke(ctx, req, handler, start)
		} else {
			resp, err = handler(ctx, req)
		}
		err = errdefs.ToGRPC(err)
		logCall(ctx, log, info.FullMethod, start, err)
		return resp, err
	}
}

func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in RPC", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		return handler(srv, ss)
	}
}

// translateStream maps errdefs categories to status codes and logs
// calls (logCall), as unaryInterceptor does.
func translateStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := errdefs.ToGRPC(handler(srv, ss))
		logCall(ss.Context(), log, info.FullMethod, start, err)
		return err
	}
}

// logCall logs a call: failures that are the server's fault at Warn, the
// rest at Debug.
func logCall(ctx context.Context, log *slog.Logger, method string, start time.Time, err error) {
	code := status.Code(err)
	level := slog.LevelDebug
	if code == codes.Internal || code == codes.Unimplemented || code == codes.DataLoss {
		level = slog.LevelWarn
	}
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("method", method), slog.String("code", code.String()), slog.Duration("duration", time.Since(start))}
	if err != nil {
		attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
	}
	log.LogAttrs(ctx, level, "rpc", attrs...)
}
