package runtimed_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
)

// claimBound is how long a held claim waits for the registration.
const claimBound = 10 * time.Second

// heldClaim is a Runs store whose first status write to Running
// (runtimed's claim) waits, at most claimBound, until registered is
// closed, then runs before (if set) and goes on: an API server answering
// the claim slowly.
type heldClaim struct {
	store.Resource[*v1alpha1.Run]
	registered <-chan struct{}
	before     func(ctx context.Context, r *v1alpha1.Run)
	once       *sync.Once
	waited     chan bool // whether the registration came first
}

func (h heldClaim) UpdateStatus(ctx context.Context, r *v1alpha1.Run) (*v1alpha1.Run, error) {
	if r.Status.Phase == v1alpha1.PhaseRunning {
		h.once.Do(func() {
			select {
			case <-h.registered:
				h.waited <- true
			case <-time.After(claimBound):
				h.waited <- false
			}
			if h.before != nil {
				h.before(ctx, r)
			}
		})
	}
	return h.Resource.UpdateStatus(ctx, r)
}

// registrations follows runtimed's calls to the Runtime Server: closes
// registered once a RegisterFunction answered, and sends each
// UnregisterFunction request to unregistered.
type registrations struct {
	once         sync.Once
	registered   chan struct{}
	unregistered chan *pb.UnregisterFunctionRequest
}

func newRegistrations() *registrations {
	return &registrations{registered: make(chan struct{}), unregistered: make(chan *pb.UnregisterFunctionRequest, 4)}
}

func (g *registrations) calls(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	switch method {
	case pb.FunctionRuntime_RegisterFunction_FullMethodName:
		if err == nil {
			g.once.Do(func() { close(g.registered) })
		}
	case pb.FunctionRuntime_UnregisterFunction_FullMethodName:
		select {
		case g.unregistered <- req.(*pb.UnregisterFunctionRequest):
		default:
		}
	}
	return err
}

// runtimed registers a function while its claim (Scheduled → Running) is
// on its way (one API round trip less before Ready, which a scale from
// zero waits for), and the Run is Ready, holding the finalizer, once the
// claim landed. Before, the registration waited for the claim: here the
// claim waits for the registration, and it timed out.
func TestRegistersWhileTheClaimIsWritten(t *testing.T) {
	g := newRegistrations()
	waited := make(chan bool, 1)
	e := newEnvWith(t, "bash", envOptions{
		runs: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			return heldClaim{Resource: r, registered: g.registered, once: &sync.Once{}, waited: waited}
		},
		calls: g.calls,
	})
	e.submit(functionRun("claim", `handle() { printf '"ok"'; }`, 0))
	if !<-waited {
		t.Fatal("the registration waited for the claim")
	}
	got := e.waitPhase("claim", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseReady || got.Status.StartTime == nil || !slices.Contains(got.Finalizers, runtimed.Finalizer) {
		t.Fatalf("phase %s (%s), startTime %v, finalizers %v; want Ready, started, holding %s",
			got.Status.Phase, got.Status.Message, got.Status.StartTime, got.Finalizers, runtimed.Finalizer)
	}
}

// A claim refused because the Run moved on meanwhile (here: reassigned to
// another pod, as after this pod was taken for lost) ends the
// registration that started beside it, cancelling anything in flight,
// and writes nothing: no Ready, no finalizer, no failure.
func TestRefusedClaimUnregisters(t *testing.T) {
	g := newRegistrations()
	waited := make(chan bool, 1)
	var raw store.Resource[*v1alpha1.Run]
	e := newEnvWith(t, "bash", envOptions{
		runs: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			raw = r
			return heldClaim{Resource: r, registered: g.registered, once: &sync.Once{}, waited: waited,
				before: func(ctx context.Context, claim *v1alpha1.Run) {
					cur, err := raw.Get(ctx, claim.Namespace, claim.Name)
					if err != nil {
						t.Errorf("read %s: %v", claim.Name, err)
						return
					}
					cur.Status.AssignedPod, cur.Status.AssignedPodUID = "bash-other", "pod-uid-2"
					if _, err := raw.UpdateStatus(ctx, cur); err != nil {
						t.Errorf("reassign %s: %v", claim.Name, err)
					}
				}}
		},
		calls: g.calls,
	})
	e.submit(functionRun("moved", `handle() { printf '"ok"'; }`, 0))
	if !<-waited {
		t.Fatal("the registration waited for the claim")
	}
	select {
	case req := <-g.unregistered:
		if !req.GetCancelInFlight() {
			t.Errorf("unregistered without cancelling what is in flight: %v", req)
		}
	case <-time.After(claimBound):
		t.Fatal("the registration of a Run whose claim was refused was not ended")
	}
	got, err := e.runs.Get(context.Background(), "default", "moved")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1alpha1.PhaseScheduled || got.Status.AssignedPodUID != "pod-uid-2" || len(got.Finalizers) != 0 {
		t.Fatalf("phase %s on %s, finalizers %v; want Scheduled on pod-uid-2 as the other writer left it, no finalizer",
			got.Status.Phase, got.Status.AssignedPodUID, got.Finalizers)
	}
}
