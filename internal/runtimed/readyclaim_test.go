package runtimed_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
)

// replicaRun is a function Run as a Function's replica is created:
// holding runtimed's finalizer already.
func replicaRun(name string) *v1alpha1.Run {
	r := functionRun(name, `handle() { printf '"ok"'; }`, 0)
	r.Finalizers = []string{runtimed.Finalizer}
	return r
}

// In Kubernetes mode (RunningAfter set) a replica whose registration is
// Ready before the bound is written once, Scheduled → Ready, with its
// startTime and endpoint: the claim and Ready were two API writes in
// series, which a scale from zero waits for.
func TestReplicaIsClaimedAndReadyInOneWrite(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	e.submit(replicaRun("one"))
	got := e.waitPhase("one", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseReady || got.Status.StartTime == nil || got.Status.Endpoint == "" ||
		!slices.Contains(got.Finalizers, runtimed.Finalizer) {
		t.Fatalf("status %+v, finalizers %v; want Ready, started, an endpoint, holding %s", got.Status, got.Finalizers, runtimed.Finalizer)
	}
	if phases := w.of("one"); !slices.Equal(phases, []v1alpha1.Phase{v1alpha1.PhaseReady}) {
		t.Fatalf("runtimed wrote %v; want one write, Ready", phases)
	}
}

// A function Run created without the finalizer (not a Function's
// replica) is still claimed first: it is marked Ready only once it holds
// the finalizer, whose write needs the claim.
func TestPlainFunctionIsClaimedThenReady(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	e.submit(functionRun("plain", `handle() { printf '"ok"'; }`, 0))
	got := e.waitPhase("plain", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseReady || !slices.Contains(got.Finalizers, runtimed.Finalizer) {
		t.Fatalf("phase %s (%s), finalizers %v; want Ready holding %s", got.Status.Phase, got.Status.Message, got.Finalizers, runtimed.Finalizer)
	}
	if phases := w.of("plain"); !slices.Equal(phases, []v1alpha1.Phase{v1alpha1.PhaseRunning, v1alpha1.PhaseReady}) {
		t.Fatalf("runtimed wrote %v; want Running, then Ready", phases)
	}
}

// A registration not done within the bound does not hold the claim: it is
// sent alone (Scheduled → Running), so the Run shows held while the
// handler loads, then Ready. Here the registration's answer waits for the
// claim to land; without the bound they would wait for each other.
func TestSlowRegistrationSendsTheClaimAlone(t *testing.T) {
	w := newStatusWrites()
	running := make(chan struct{})
	var once sync.Once
	w.before = func(_ context.Context, r *v1alpha1.Run) {
		if r.Status.Phase == v1alpha1.PhaseRunning {
			once.Do(func() { close(running) })
		}
	}
	waited := make(chan bool, 1)
	calls := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == pb.FunctionRuntime_RegisterFunction_FullMethodName {
			select {
			case <-running:
				waited <- true
			case <-time.After(claimBound):
				waited <- false
			}
		}
		return err
	}
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: time.Millisecond, calls: calls})
	e.submit(replicaRun("slow"))
	if !<-waited {
		t.Fatal("the claim waited for a registration past the bound")
	}
	got := e.waitPhase("slow", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseReady || got.Status.StartTime == nil {
		t.Fatalf("status %+v; want Ready, started", got.Status)
	}
	if phases := w.of("slow"); !slices.Equal(phases, []v1alpha1.Phase{v1alpha1.PhaseRunning, v1alpha1.PhaseReady}) {
		t.Fatalf("runtimed wrote %v; want Running, then Ready", phases)
	}
}

// A claim with Ready refused because the Run moved on meanwhile (here:
// reassigned to another pod) ends the registration, cancelling anything
// in flight, and writes nothing.
func TestRefusedClaimWithReadyUnregisters(t *testing.T) {
	g := newRegistrations()
	w := newStatusWrites()
	var once sync.Once
	w.before = func(ctx context.Context, claim *v1alpha1.Run) {
		once.Do(func() {
			cur, err := w.Resource.Get(ctx, claim.Namespace, claim.Name)
			if err != nil {
				t.Errorf("read %s: %v", claim.Name, err)
				return
			}
			cur.Status.AssignedPod, cur.Status.AssignedPodUID = "bash-other", "pod-uid-2"
			if _, err := w.Resource.UpdateStatus(ctx, cur); err != nil {
				t.Errorf("reassign %s: %v", claim.Name, err)
			}
		})
	}
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never, calls: g.calls})
	e.submit(replicaRun("moved"))
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
	if got.Status.Phase != v1alpha1.PhaseScheduled || got.Status.AssignedPodUID != "pod-uid-2" {
		t.Fatalf("phase %s on %s; want Scheduled on pod-uid-2 as the other writer left it", got.Status.Phase, got.Status.AssignedPodUID)
	}
	if phases := w.of("moved"); len(phases) != 0 {
		t.Fatalf("runtimed wrote %v; want nothing", phases)
	}
}

// A replica deleted while its registration is on its way (a scale down
// before it was Ready) is let go: its registration ended, runtimed's
// finalizer removed, so the delete ends.
func TestReplicaDeletedBeforeTheClaimIsLetGo(t *testing.T) {
	g := newRegistrations()
	w := newStatusWrites()
	var once sync.Once
	w.before = func(ctx context.Context, claim *v1alpha1.Run) {
		once.Do(func() {
			if err := w.Resource.Delete(ctx, claim.Namespace, claim.Name, store.DeleteOptions{}); err != nil {
				t.Errorf("delete %s: %v", claim.Name, err)
			}
		})
	}
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never, calls: g.calls})
	e.submit(replicaRun("gone"))
	select {
	case <-g.unregistered:
	case <-time.After(claimBound):
		t.Fatal("the registration of a deleted replica was not ended")
	}
	for deadline := time.Now().Add(claimBound); ; time.Sleep(5 * time.Millisecond) { // polling an observable state
		_, err := e.runs.Get(context.Background(), "default", "gone")
		if errdefs.Code(err) == codes.NotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted replica is still there: %v", err)
		}
	}
}

// A replica takes invocations as soon as it is stored Ready: the
// gateway's watch may deliver the write before it returns to runtimed.
// Before, the one write went before the hop knew the registration, and
// such an invocation was refused as "registering" (FailedPrecondition,
// the gateway's 503 with Retry-After: 1 s).
func TestReplicaTakesInvocationsOnceStoredReady(t *testing.T) {
	w := newStatusWrites()
	var e *env
	var once sync.Once
	invoked := make(chan error, 1)
	w.after = func(ctx context.Context, stored *v1alpha1.Run) {
		if stored.Status.Phase != v1alpha1.PhaseReady {
			return
		}
		once.Do(func() {
			resp, err := e.d.Proxy().InvokeFunction(ctx, &pb.InvokeFunctionRequest{
				Registration: &pb.FunctionRegistration{RunUid: string(stored.UID)}, Input: []byte(`1`)})
			if err == nil && string(resp.GetOutput()) != `"ok"` {
				err = fmt.Errorf("answer %q", resp.GetOutput())
			}
			invoked <- err
		})
	}
	e = newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	e.submit(replicaRun("early"))
	select {
	case err := <-invoked:
		if err != nil {
			t.Fatalf("an invocation of the replica stored Ready: %v", err)
		}
	case <-time.After(claimBound):
		t.Fatal("the replica was never written Ready")
	}
}
