package retry

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// Condition types of an assignment, which a retry withdraws.
const (
	conditionScheduled = "Scheduled"
	conditionReady     = "Ready"
)

// Apply writes d into run's status.
//
// A retry makes the Run Pending again as attempt d.NextAttempt: it records
// the reason and message; clears the assignment (assignedPod,
// assignedPodUID) and everything the failed attempt produced (startTime,
// exitCode, outputs, endpoint), so the next attempt gets its own startTime
// and thus its full spec.timeout; sets any Scheduled and Ready conditions
// False; and sets the Retrying condition True, from which NotBefore reads
// d.NotBefore back.
//
// An end sets phase, reason and message, completionTime (unless already
// set) and any Retrying condition False. The assignment is kept for the
// record. Applying the decision Decide returns for a terminal Run changes
// nothing but a missing completionTime.
func Apply(run *v1alpha1.Run, d Decision) {
	st := &run.Status
	st.Reason = string(d.Reason)
	st.Message = d.Message
	if d.Retry {
		st.Phase = v1alpha1.PhasePending
		st.Attempt = d.NextAttempt
		st.AssignedPod, st.AssignedPodUID = "", ""
		st.StartTime, st.CompletionTime, st.ExitCode = nil, nil, nil
		st.Outputs = nil
		st.Endpoint = ""
		at := metav1.NewTime(ceilSecond(d.At))
		for _, t := range []string{conditionScheduled, conditionReady} {
			if c := meta.FindStatusCondition(st.Conditions, t); c != nil && c.Status != metav1.ConditionFalse {
				setCondition(st, t, metav1.ConditionFalse, d.Reason, d.Message, at)
			}
		}
		setCondition(st, ConditionRetrying, metav1.ConditionTrue, d.Reason, d.Message, at)
		return
	}
	st.Phase = d.Phase
	if st.CompletionTime == nil {
		ct := metav1.NewTime(d.At)
		st.CompletionTime = &ct
	}
	if c := meta.FindStatusCondition(st.Conditions, ConditionRetrying); c != nil && c.Status != metav1.ConditionFalse {
		setCondition(st, ConditionRetrying, metav1.ConditionFalse, d.Reason, "no further attempt", metav1.NewTime(d.At))
	}
}

// NotBefore returns the earliest time the scheduler may assign run, and
// whether run is waiting for a retry at all (Pending with the Retrying
// condition True). It is the Retrying condition's lastTransitionTime plus
// the backoff that preceded status.attempt.
func NotBefore(run *v1alpha1.Run) (time.Time, bool) {
	if run.Status.Phase != v1alpha1.PhasePending {
		return time.Time{}, false
	}
	c := meta.FindStatusCondition(run.Status.Conditions, ConditionRetrying)
	if c == nil || c.Status != metav1.ConditionTrue {
		return time.Time{}, false
	}
	return c.LastTransitionTime.Add(Backoff(run.Spec.RetryPolicy, run.Status.Attempt-1)), true
}

// setCondition sets a condition, always moving its lastTransitionTime to at
// (NotBefore depends on it even when the status stays True).
func setCondition(st *v1alpha1.RunStatus, t string, status metav1.ConditionStatus, reason Reason, msg string, at metav1.Time) {
	c := metav1.Condition{Type: t, Status: status, Reason: string(reason), Message: msg, LastTransitionTime: at}
	if old := meta.FindStatusCondition(st.Conditions, t); old != nil {
		c.ObservedGeneration = old.ObservedGeneration
		*old = c
		return
	}
	st.Conditions = append(st.Conditions, c)
}

// Requeue makes run Pending again without spending an attempt, for a loss
// that is not the Run's failure (Stoke itself restarted): it records
// reason and message, clears the assignment, sets any Scheduled and Ready
// conditions False, and keeps status.attempt, status.startTime and
// status.endpoint. No Retrying condition is set, so the scheduler may
// assign the Run at once.
func Requeue(run *v1alpha1.Run, reason Reason, message string, at time.Time) {
	st := &run.Status
	st.Phase = v1alpha1.PhasePending
	st.Attempt = max(st.Attempt, 1)
	st.Reason, st.Message = string(reason), message
	st.AssignedPod, st.AssignedPodUID = "", ""
	t := metav1.NewTime(at)
	for _, ct := range []string{conditionScheduled, conditionReady} {
		if c := meta.FindStatusCondition(st.Conditions, ct); c != nil && c.Status != metav1.ConditionFalse {
			setCondition(st, ct, metav1.ConditionFalse, reason, message, t)
		}
	}
}
