package scheduler_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/scheduler"
)

func pinnedTo(p podsource.Pod) func(*v1alpha1.Run) {
	return func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{PodUID: p.UID} }
}

// A pinned Run goes only to its pod, waits there while the pod is full
// (although another pod of the pool is free), saying so once it has
// waited UnschedulableAfter, and takes the slot the pod frees before an
// older Run of the pool does.
func TestPinnedRunWaitsForItsPod(t *testing.T) {
	a, b := pod("bash", "a", 1), pod("bash", "b", 1)
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{a, b}, unschedulableAfter: -1})
	e.create("first", "bash", pinnedTo(a))
	e.track.waitFor("first scheduled", phaseIs("first", v1alpha1.PhaseScheduled))
	if got := e.track.get("first").Status.AssignedPodUID; got != a.UID {
		t.Fatalf("first went to %s, want %s", got, a.UID)
	}
	e.create("second", "bash", pinnedTo(a))
	e.create("free", "bash") // takes b
	e.track.waitFor("free scheduled", phaseIs("free", v1alpha1.PhaseScheduled))
	e.create("older", "bash") // waits in the pool's queue; no pod is free
	if got := e.track.get("second").Status.Phase; got != "" && got != v1alpha1.PhasePending {
		t.Fatalf("second is %s while its pod is full", got)
	}
	// Waiting past UnschedulableAfter for its full pod, it says so.
	e.track.waitFor("second waiting for its pod", func(m map[string]*v1alpha1.Run) bool {
		c := meta.FindStatusCondition(m["second"].Status.Conditions, scheduler.ConditionScheduled)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == scheduler.ReasonWaitingForPod
	})
	if r := e.track.get("second"); r.Status.Phase != v1alpha1.PhasePending ||
		!strings.Contains(meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled).Message, "pod a ") {
		t.Errorf("second: phase %s, conditions %+v; want Pending naming pod a", r.Status.Phase, r.Status.Conditions)
	}
	// a's slot frees: the pinned Run takes it, not the pool's Run.
	e.setStatus("first", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("second scheduled", phaseIs("second", v1alpha1.PhaseScheduled))
	if got := e.track.get("second"); got.Status.AssignedPodUID != a.UID || !meta.IsStatusConditionTrue(got.Status.Conditions, scheduler.ConditionScheduled) {
		t.Errorf("second went to %s (conditions %+v), want %s, Scheduled", got.Status.AssignedPodUID, got.Status.Conditions, a.UID)
	}
	if got := e.track.get("older").Status.Phase; got == v1alpha1.PhaseScheduled {
		t.Errorf("older was scheduled on a full pool")
	}
	for _, name := range []string{"first", "second", "free", "older"} {
		if c := e.track.get(name); c.Status.Phase == v1alpha1.PhaseFailed {
			t.Errorf("%s failed: %s", name, c.Status.Message)
		}
	}
}

// A Run pinned to a pod that goes while it waits, or to a pod that never
// was, ends Failed/Unschedulable naming the pod; one pinned to a pod of
// another Runtime too.
func TestPinnedRunOfAGonePodFails(t *testing.T) {
	a, other := pod("bash", "a", 1), pod("python", "p", 4)
	e := newEnv(t, envOptions{runtimes: []string{"bash", "python"}, ready: []podsource.Pod{a, other}, unschedulableAfter: -1})
	e.create("holder", "bash", pinnedTo(a))
	e.track.waitFor("holder scheduled", phaseIs("holder", v1alpha1.PhaseScheduled))
	e.create("waiter", "bash", pinnedTo(a))
	e.create("nowhere", "bash", func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{PodUID: "uid-never"} })
	e.create("elsewhere", "bash", pinnedTo(other))
	for name, want := range map[string]string{
		"nowhere":   "no ready pod of runtime default/bash has UID uid-never",
		"elsewhere": "is pod p of runtime default/python, not of runtime default/bash",
	} {
		e.track.waitFor(name+" failed", phaseIs(name, v1alpha1.PhaseFailed))
		checkUnschedulable(t, e.track.get(name), want)
	}
	if got := e.track.get("waiter").Status.Phase; got != "" && got != v1alpha1.PhasePending {
		t.Fatalf("waiter is %s while its pod is full", got)
	}
	e.send(podsource.Event{Type: podsource.PodGone, Pod: a, Reason: podsource.ReasonExited})
	e.track.waitFor("waiter failed", phaseIs("waiter", v1alpha1.PhaseFailed))
	checkUnschedulable(t, e.track.get("waiter"), "pod a (UID uid-a), which spec.placement.podUID names, is gone")
	// A Run pinned to the gone pod later fails the same way.
	e.create("late", "bash", pinnedTo(a))
	e.track.waitFor("late failed", phaseIs("late", v1alpha1.PhaseFailed))
	checkUnschedulable(t, e.track.get("late"), "pod a (UID uid-a)")
	if n := e.sched.Waiting(); n != 0 {
		t.Errorf("%d Runs still wait", n)
	}
}

func checkUnschedulable(t *testing.T, r *v1alpha1.Run, msg string) {
	t.Helper()
	if r.Status.Reason != string(retry.Unschedulable) || !strings.Contains(r.Status.Message, msg) || r.Status.CompletionTime == nil {
		t.Errorf("%s: reason %q message %q; want %s, %q", r.Name, r.Status.Reason, r.Status.Message, retry.Unschedulable, msg)
	}
}
