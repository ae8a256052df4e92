package placement_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/retry"
)

func function() *v1alpha1.Run {
	return &v1alpha1.Run{Spec: v1alpha1.RunSpec{Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "main.handler"}}}}
}

// Unclaimed names the pod of a function Run placed at its create only
// while nothing has been written to it: not for a Run only pinned there,
// a task, or one already assigned or with a phase.
func TestUnclaimed(t *testing.T) {
	placed := function()
	placement.Place(placed, "pod-a")
	pinned := function()
	pinned.Spec.Placement = &v1alpha1.Placement{PodUID: "pod-a"}
	task := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
	placement.Place(task, "pod-a")
	pending := placed.DeepCopy()
	pending.Status.Phase = v1alpha1.PhasePending
	assigned := placed.DeepCopy()
	placement.Assign(assigned, "a", "pod-a", time.Now())
	deleting := placed.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	for name, c := range map[string]struct {
		run  *v1alpha1.Run
		want string
	}{
		"placed":   {placed, "pod-a"},
		"deleting": {deleting, "pod-a"}, // runtimed takes it to let go of it
		"pinned":   {pinned, ""},
		"task":     {task, ""},
		"pending":  {pending, ""},
		"assigned": {assigned, ""},
	} {
		if got := placement.Unclaimed(c.run); got != c.want {
			t.Errorf("%s: Unclaimed = %q, want %q", name, got, c.want)
		}
	}
	if !placement.Marked(assigned) || placement.Marked(pinned) {
		t.Error("Marked: want true for a placed Run whatever its status, false for a pinned one")
	}
}

// Assign writes the scheduler's assignment: Scheduled on the pod, attempt
// at least 1, the reason of the wait cleared, Scheduled=True, and a
// Retrying condition ended.
func TestAssign(t *testing.T) {
	r := function()
	r.Status.Phase, r.Status.Reason, r.Status.Message = v1alpha1.PhasePending, "Unschedulable", "waiting"
	r.Status.Conditions = []metav1.Condition{{Type: retry.ConditionRetrying, Status: metav1.ConditionTrue, Reason: "PodGone"}}
	placement.Assign(r, "bash-x", "uid-x", time.Now())
	st := r.Status
	if st.Phase != v1alpha1.PhaseScheduled || st.AssignedPod != "bash-x" || st.AssignedPodUID != "uid-x" || st.Attempt != 1 || st.Reason != "" || st.Message != "" {
		t.Fatalf("status %+v", st)
	}
	if !meta.IsStatusConditionTrue(st.Conditions, placement.ConditionScheduled) || !meta.IsStatusConditionFalse(st.Conditions, retry.ConditionRetrying) {
		t.Fatalf("conditions %+v", st.Conditions)
	}
}
