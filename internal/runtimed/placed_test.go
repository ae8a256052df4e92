package runtimed_test

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/placement"
)

// create creates run as it is, with nothing written to its status.
func (e *env) create(run *v1alpha1.Run) {
	e.t.Helper()
	if _, err := e.runs.Create(context.Background(), run); err != nil {
		e.t.Fatal(err)
	}
}

// A replica placed on this pod at its create (the scheduler's Place, the
// Function controller's create) is taken as created: its first status
// write is runtimed's, assigned, claimed and Ready at once, so no
// Scheduled write comes before it. One placed on another pod is not
// taken.
func TestPlacedReplicaIsAssignedClaimedAndReadyInOneWrite(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	other := replicaRun("other")
	placement.Place(other, "pod-uid-2")
	e.create(other)
	one := replicaRun("one")
	placement.Place(one, e.pod.UID)
	e.create(one)
	got := e.waitPhase("one", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	st := got.Status
	if st.Phase != v1alpha1.PhaseReady || st.AssignedPodUID != e.pod.UID || st.AssignedPod != e.pod.Name || st.Attempt != 1 ||
		st.StartTime == nil || st.Endpoint == "" || !meta.IsStatusConditionTrue(st.Conditions, placement.ConditionScheduled) {
		t.Fatalf("status %+v; want Ready on %s, attempt 1, started, an endpoint, Scheduled=True", st, e.pod.UID)
	}
	if phases := w.of("one"); !slices.Equal(phases, []v1alpha1.Phase{v1alpha1.PhaseReady}) {
		t.Fatalf("runtimed wrote %v; want one write, Ready", phases)
	}
	// The events reach runtimed in order: other's create came first.
	if phases := w.of("other"); len(phases) != 0 {
		t.Errorf("runtimed wrote %v to a Run placed on another pod", phases)
	}
	if o, err := e.runs.Get(context.Background(), "default", "other"); err != nil || o.Status.Phase != "" {
		t.Errorf("other: %v, %+v; want nothing written", err, o)
	}
}

// A placed Run that the scheduler assigns too (its runtimed late: the
// scheduler's write after placedWait) ends Ready here whichever write
// lands first: runtimed's claim re-reads on the conflict and finds it
// Scheduled here, or the scheduler's write conflicts.
func TestPlacedRunAssignedByTheSchedulerIsClaimed(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	r := replicaRun("late")
	placement.Place(r, e.pod.UID)
	e.submit(r) // created, then assigned here as the scheduler does
	got := e.waitPhase("late", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseReady || got.Status.AssignedPodUID != e.pod.UID {
		t.Fatalf("status %+v; want Ready here", got.Status)
	}
}
