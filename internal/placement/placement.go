// Package placement is how a Run comes to be on a runtime pod, in the
// terms both of its writers share: the scheduler's assignment (phase
// Scheduled, the pod, the Scheduled condition), and a placement made
// before the Run's create (spec.placement.podUID with
// v1alpha1.AnnotationPlaced), which lets the pod's runtimed write the
// assignment together with its claim: one API write less between a
// Function replica's create and its first answer.
package placement

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/retry"
)

// Condition type and reason of an assignment.
const (
	// ConditionScheduled is True once the Run is assigned to a pod.
	ConditionScheduled = "Scheduled"
	// ReasonScheduled is the reason of Scheduled=True, and of
	// Retrying=False when an assignment ends the wait for a retry.
	ReasonScheduled = "Scheduled"
)

// Assign makes run Scheduled on the pod named podName with UID podUID.
func Assign(run *v1alpha1.Run, podName, podUID string, now time.Time) {
	st := &run.Status
	st.Phase = v1alpha1.PhaseScheduled
	st.AssignedPod, st.AssignedPodUID = podName, podUID
	st.Attempt = max(st.Attempt, 1)
	// Reason and message described why the Run was waiting; the Retrying
	// condition keeps the last failure.
	st.Reason, st.Message = "", ""
	at := metav1.NewTime(now)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: ConditionScheduled, Status: metav1.ConditionTrue, Reason: ReasonScheduled,
		Message:            fmt.Sprintf("attempt %d assigned to pod %s", st.Attempt, podName),
		ObservedGeneration: run.Generation, LastTransitionTime: at,
	})
	if c := meta.FindStatusCondition(st.Conditions, retry.ConditionRetrying); c != nil && c.Status != metav1.ConditionFalse {
		c.Status, c.Reason, c.LastTransitionTime = metav1.ConditionFalse, ReasonScheduled, at
	}
}

// Place marks run, before its create, as placed on the pod with UID podUID.
func Place(run *v1alpha1.Run, podUID string) {
	if run.Spec.Placement == nil {
		run.Spec.Placement = &v1alpha1.Placement{}
	}
	run.Spec.Placement.PodUID = podUID
	if run.Annotations == nil {
		run.Annotations = map[string]string{}
	}
	run.Annotations[v1alpha1.AnnotationPlaced] = "true"
}

// Marked reports whether run says it was placed at its create on its
// spec.placement.podUID, whatever its status now.
func Marked(run *v1alpha1.Run) bool {
	return run.Annotations[v1alpha1.AnnotationPlaced] == "true" && run.Spec.Placement != nil && run.Spec.Placement.PodUID != ""
}

// Unclaimed is the pod UID a function Run was placed on at its create
// while no one has written its status yet (phase empty, no assignment):
// the Run that pod's runtimed may take as created. "" for any other Run;
// a task is not taken so (its claim may be deferred to its end, which
// would then be the first write: the scheduler assigns it).
func Unclaimed(run *v1alpha1.Run) string {
	if !Marked(run) || run.Spec.Mode.Function == nil || run.Status.Phase != "" || run.Status.AssignedPodUID != "" {
		return ""
	}
	return run.Spec.Placement.PodUID
}
