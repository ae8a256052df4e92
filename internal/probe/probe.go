// Package probe is how a Stoke process in a Pod answers its liveness and
// readiness probes without opening a TCP port: the standard
// grpc.health.v1 service on a Unix socket in a directory that only the
// process's user may enter (0700), asked by an exec probe, a `stoke ...
// probe` command run in the same container.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Listen listens on the Unix socket path after making its directory
// private (ListenPrivate).
func Listen(path string) (net.Listener, error) { return ListenPrivate("probe socket", path) }

// ListenPrivate listens on the Unix socket path after making its
// directory private (created if missing, then chmod 0700); it refuses a
// directory it cannot make so. A stale socket file is replaced. what
// names the socket in errors.
func ListenPrivate(what, path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%s: %s must be private to this user (0700): %w", what, dir, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return lis, nil
}

// Serve answers health checks from hs on lis until ctx ends, then stops
// the server and returns nil (or the error that ended it first).
func Serve(ctx context.Context, lis net.Listener, hs healthpb.HealthServer) error {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("probe socket: %w", err)
	}
}

// NewHealth is a health server whose statuses the process sets; every
// service starts NOT_SERVING.
func NewHealth(services ...string) *health.Server {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	for _, s := range services {
		hs.SetServingStatus(s, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return hs
}

// Check asks the process listening on socket about service ("" is the
// process as a whole): nil means SERVING, an error says why not.
func Check(ctx context.Context, socket, service string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("probe %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("not ready: %s", status.Convert(err).Message())
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("not ready: %s", resp.GetStatus())
	}
	return nil
}
