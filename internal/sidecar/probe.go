package sidecar

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"stoke.dev/stoke/internal/probe"
)

// DefaultProbeSocket is where runtimed answers its readiness probe: in the
// Pod's run directory, which only the Pod's own user can enter.
const DefaultProbeSocket = "/var/run/stoke/runtimed.sock"

// DefaultDebugSocket is `stoke runtimed`'s --debug-socket, in a directory
// runtimed makes 0700 (internal/debugsock).
const DefaultDebugSocket = "/var/run/stoke/runtimed/debug.sock"

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

// Probe asks the runtimed listening on socket whether it is ready; nil
// means ready, an error says why not. It is `stoke runtimed probe`, the
// runtime Pod's readiness probe.
func Probe(ctx context.Context, socket string) error {
	if err := probe.Check(ctx, socket, ""); err != nil {
		return fmt.Errorf("runtimed: %w", err)
	}
	return nil
}
