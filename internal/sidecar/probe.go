package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// DefaultProbeSocket is where runtimed answers its readiness probe: in the
// Pod's run directory, which only the Pod's own user can enter.
const DefaultProbeSocket = "/var/run/stoke/runtimed.sock"

// rsCheckTimeout bounds the Runtime Server health check a probe makes.
const rsCheckTimeout = time.Second

// readiness answers grpc.health.v1 on the probe socket from runtimed's
// live state: SERVING only while its Run informer has synced, its Runtime
// Server answers its own health check, and its Lease is fresh. Anything
// else is Unavailable with the reason, which `stoke runtimed probe`
// prints.
type readiness struct {
	healthpb.UnimplementedHealthServer
	checks []func(ctx context.Context) error
}

func (r *readiness) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	for _, check := range r.checks {
		if err := check(ctx); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// listenPrivate listens on a Unix socket whose directory is made 0700
// first (created if missing); it refuses a directory it cannot make so.
func listenPrivate(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("probe socket: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("probe socket: %s must be private to this user (0700): %w", dir, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("probe socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("probe socket: %w", err)
	}
	return lis, nil
}

// Probe asks the runtimed listening on socket whether it is ready; nil
// means ready, an error says why not. It is `stoke runtimed probe`, the
// runtime Pod's readiness probe.
func Probe(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("probe %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("runtimed is not ready: %s", status.Convert(err).Message())
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("runtimed is not ready: %s", resp.GetStatus())
	}
	return nil
}
