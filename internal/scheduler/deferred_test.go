package scheduler_test

import (
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// TestDeferredRunWaitsForItsRelease: a Run named to Defer is not placed
// while deferred, though it is older than a Run that is (the one slot goes
// to the younger), and is placed in its turn once released.
func TestDeferredRunWaitsForItsRelease(t *testing.T) {
	a := pod("bash", "a", 1)
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{a}, unschedulableAfter: time.Hour})
	release := e.sched.Defer([]informer.Key{{Namespace: store.DefaultNamespace, Name: "r1"}})
	e.create("r1", "bash")
	e.create("r2", "bash")
	e.track.waitFor("r2 scheduled on the one slot", phaseIs("r2", v1alpha1.PhaseScheduled))
	if got := e.track.get("r1").Status; got.Phase != "" || got.AssignedPod != "" {
		t.Fatalf("r1 is deferred, yet %q on %q", got.Phase, got.AssignedPod)
	}
	release()
	release() // a second call does nothing
	e.setStatus("r2", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r1 scheduled once released and the slot freed", phaseIs("r1", v1alpha1.PhaseScheduled))
	if got := e.track.get("r1").Status.AssignedPodUID; got != a.UID {
		t.Fatalf("r1 assigned to %q", got)
	}
	if n := e.track.writesOf("r1"); n != 2 {
		t.Errorf("r1 had %d writes, want 2 (created, scheduled): a deferral writes nothing", n)
	}
	e.track.check()
}

// TestDeferralLapses: a deferral never released lapses after its bound
// (10 s), and the Run is placed then, not before.
func TestDeferralLapses(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{pod("bash", "a", 2)}, unschedulableAfter: time.Hour})
	e.sched.Defer([]informer.Key{{Namespace: store.DefaultNamespace, Name: "r1"}})
	e.create("r1", "bash")
	e.create("r2", "bash")
	e.track.waitFor("r2 scheduled", phaseIs("r2", v1alpha1.PhaseScheduled))
	awaitTimer(t, fc)
	fc.Step(10*time.Second - time.Millisecond)
	e.create("r3", "bash")
	e.track.waitFor("r3 scheduled", phaseIs("r3", v1alpha1.PhaseScheduled))
	if ph := e.track.get("r1").Status.Phase; ph != "" {
		t.Fatalf("r1 is %q before its deferral lapsed", ph)
	}
	e.setStatus("r2", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r2 ended", phaseIs("r2", v1alpha1.PhaseSucceeded))
	fc.Step(time.Millisecond)
	e.track.waitFor("r1 scheduled once its deferral lapsed", phaseIs("r1", v1alpha1.PhaseScheduled))
	e.track.check()
}
