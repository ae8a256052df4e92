package scheduler_test

import (
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// place asks e's scheduler for a slot for the Run name of Runtime bash,
// once the scheduler serves.
func (e *env) place(name string) (string, bool) {
	e.t.Helper()
	return e.sched.Place(e.ctx, store.DefaultNamespace, name, "bash")
}

// awaitServing waits until Place answers, with a first reservation for
// name (Place reserves nothing while the scheduler does not serve yet).
func (e *env) awaitServing(t *testing.T, name string) string {
	t.Helper()
	var uid string
	waitUntil(t, "the scheduler serving Place", func() bool {
		var ok bool
		uid, ok = e.place(name)
		return ok
	})
	return uid
}

// createPlaced creates a function Run placed on podUID and tells the
// scheduler of it, as the Function controller does.
func (e *env) createPlaced(name, podUID string) {
	e.t.Helper()
	run := e.create(name, "bash", func(r *v1alpha1.Run) {
		r.Spec.Mode = v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "main.handler"}}
		placement.Place(r, podUID)
	})
	e.sched.Created(run)
}

// barrier returns once the scheduler has decided everything created
// before it: a cancelled Run is ended after them.
func (e *env) barrier(name string) {
	e.t.Helper()
	e.create(name, "bash", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	e.track.waitFor(name+" cancelled", phaseIs(name, v1alpha1.PhaseCancelled))
}

// A Run placed at its create is left to its pod's runtimed: the
// scheduler writes nothing while it waits, keeps its pod's slot for it
// (a Run of the pool does not get it), and writes the assignment itself
// once placedWait passed with nothing written.
func TestPlacedRunIsLeftToItsRuntimedThenAssigned(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	a := pod("bash", "a", 1)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{a}, unschedulableAfter: time.Hour})
	if uid := e.awaitServing(t, "r1"); uid != a.UID {
		t.Fatalf("placed on %q, want %q", uid, a.UID)
	}
	if uid, ok := e.place("r2"); ok {
		t.Fatalf("a second Run placed on %s, whose one slot is reserved", uid)
	}
	e.createPlaced("r1", a.UID)
	e.create("plain", "bash")
	e.barrier("b1")
	if st := e.track.get("r1").Status; st.Phase != "" {
		t.Fatalf("r1 written before its runtimed could take it: %+v", st)
	}
	if ph := e.track.get("plain").Status.Phase; ph != "" {
		t.Fatalf("plain is %s: it took the slot kept for r1", ph)
	}
	awaitTimer(t, fc)
	fc.Step(time.Second)
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	r1 := e.track.get("r1")
	// Two writes: the create and the assignment.
	if r1.Status.AssignedPodUID != a.UID || r1.Status.Attempt != 1 || e.track.writesOf("r1") != 2 {
		t.Errorf("r1: %+v after %d writes; want Scheduled on %s, attempt 1, after the create and one write", r1.Status, e.track.writesOf("r1"), a.UID)
	}
	if ph := e.track.get("plain").Status.Phase; ph != "" {
		t.Errorf("plain is %s: r1 holds the only slot", ph)
	}
}

// A placed Run its runtimed took (its assignment written with its
// claim) is not written by the scheduler, and holds its slot until it
// ends; then the slot goes to the pool's waiting Run.
func TestPlacedRunTakenByItsRuntimed(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	a := pod("bash", "a", 1)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{a}, unschedulableAfter: time.Hour})
	e.awaitServing(t, "r1")
	e.createPlaced("r1", a.UID)
	e.barrier("b1")
	// runtimed's one write: assigned, claimed and Ready.
	e.setStatus("r1", func(st *v1alpha1.RunStatus) {
		r := &v1alpha1.Run{Status: *st}
		placement.Assign(r, a.Name, a.UID, fc.Now())
		*st = r.Status
		st.Phase = v1alpha1.PhaseReady
	})
	e.create("plain", "bash")
	e.barrier("b2")
	awaitTimer(t, fc)
	fc.Step(2 * time.Second)
	e.barrier("b3")
	if r1 := e.track.get("r1"); r1.Status.Phase != v1alpha1.PhaseReady || e.track.writesOf("r1") != 2 {
		t.Fatalf("r1 is %s after %d writes; want Ready after the create and runtimed's one", r1.Status.Phase, e.track.writesOf("r1"))
	}
	if ph := e.track.get("plain").Status.Phase; ph != "" {
		t.Fatalf("plain is %s while r1 holds the only slot", ph)
	}
	e.setStatus("r1", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("plain scheduled", phaseIs("plain", v1alpha1.PhaseScheduled))
}

// A reservation is given back by Unplace, and lapses when no Run of its
// name comes; Place reserves nothing while Runs wait for the pool (they
// go first).
func TestPlacementGivenBackLapsesAndQueues(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	a := pod("bash", "a", 1)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{a}, unschedulableAfter: time.Hour})
	e.awaitServing(t, "r1")
	e.sched.Unplace(store.DefaultNamespace, "r1")
	if _, ok := e.place("r2"); !ok {
		t.Fatal("the slot Unplace gave back was not placed again")
	}
	awaitTimer(t, fc)
	fc.Step(10 * time.Second) // r2 never came
	waitUntil(t, "r2's reservation lapsed", func() bool {
		_, ok := e.place("r3")
		return ok
	})
	e.sched.Unplace(store.DefaultNamespace, "r3")
	e.create("holder", "bash")
	e.track.waitFor("holder scheduled", phaseIs("holder", v1alpha1.PhaseScheduled))
	e.create("waiter", "bash")
	waitUntil(t, "waiter queued", func() bool { return e.sched.Waiting() == 1 })
	if uid, ok := e.place("r4"); ok {
		t.Errorf("placed on %s ahead of a waiting Run", uid)
	}
}

// A placed Run whose pod goes before anyone wrote it fails Unschedulable,
// as a Run pinned there does.
func TestPlacedRunOfAGonePodFails(t *testing.T) {
	a, b := pod("bash", "a", 1), pod("bash", "b", 1)
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{a, b}, unschedulableAfter: time.Hour})
	uid := e.awaitServing(t, "r1")
	e.createPlaced("r1", uid)
	e.barrier("b1")
	gone := a
	if uid == b.UID {
		gone = b
	}
	e.send(podsource.Event{Type: podsource.PodGone, Pod: gone, Reason: podsource.ReasonExited})
	e.track.waitFor("r1 failed", phaseIs("r1", v1alpha1.PhaseFailed))
	checkUnschedulable(t, e.track.get("r1"), "which spec.placement.podUID names, is gone")
}
