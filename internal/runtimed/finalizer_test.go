package runtimed_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
)

// heldUpdates is a Runs store whose Updates (runtimed's finalizer write)
// wait for release, at most a bound: an API server answering slowly.
type heldUpdates struct {
	store.Resource[*v1alpha1.Run]
	release  <-chan struct{}
	timedOut *atomic.Bool
}

func (h heldUpdates) Update(ctx context.Context, r *v1alpha1.Run) (*v1alpha1.Run, error) {
	select {
	case <-h.release:
	case <-time.After(20 * time.Second):
		h.timedOut.Store(true)
	}
	return h.Resource.Update(ctx, r)
}

// runtimed registers a function while its finalizer's write is on its way
// (one API round trip less before Ready, which a scale from zero waits
// for), and the Run is Ready only once it holds the finalizer. Before,
// the registration waited for the write: here, the write waits for the
// registration, so the Update timed out.
func TestRegistersWhileTheFinalizerIsWritten(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	var timedOut atomic.Bool
	e := newEnvWith(t, "bash", envOptions{
		runs: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			return heldUpdates{Resource: r, release: release, timedOut: &timedOut}
		},
		calls: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == pb.FunctionRuntime_RegisterFunction_FullMethodName {
				once.Do(func() { close(release) })
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		},
	})
	e.submit(functionRun("fin", `handle() { printf '"ok"'; }`, 0))
	got := e.waitPhase("fin", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if timedOut.Load() {
		t.Fatal("the finalizer's write waited for a registration that waited for it")
	}
	if got.Status.Phase != v1alpha1.PhaseReady || !slices.Contains(got.Finalizers, runtimed.Finalizer) {
		t.Fatalf("phase %s (%s), finalizers %v; want Ready holding %s", got.Status.Phase, got.Status.Message, got.Finalizers, runtimed.Finalizer)
	}
}
