package gateway

import (
	"fmt"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// NotReadyRetry is the Retry-After of an invocation of a function that is
// not Ready yet but may become so (registering, or waiting for a pod), or
// whose pod is gone.
const NotReadyRetry = time.Second

// Invocable is the one rule both modes' Routers apply to the Run an
// invocation names: a task, or a Run that has ended or is being deleted
// or cancelled, is FailedPrecondition (503 without Retry-After: it will
// not be Ready again); a function that is not Ready yet (registering, or
// registered again after a restart) is Unavailable with a Retry-After.
func Invocable(run *v1alpha1.Run) error {
	phase := run.Status.Phase
	switch {
	case run.Spec.Mode.Function == nil:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s/%s is a task, not a function", run.Namespace, run.Name)
	case run.DeletionTimestamp != nil:
		// Its finalizers hold it; runtimed has let its registration go.
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s/%s is being deleted (since %s): it takes no more invocations",
			run.Namespace, run.Name, run.DeletionTimestamp.UTC().Format(time.RFC3339))
	case phase.Terminal():
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s/%s is %s, not Ready", run.Namespace, run.Name, phase)
	case run.Spec.CancelRequested:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s/%s is being cancelled: it takes no more invocations", run.Namespace, run.Name)
	case phase != v1alpha1.PhaseReady:
		if phase == "" {
			phase = v1alpha1.PhasePending
		}
		msg := fmt.Sprintf("run %s/%s is %s, not Ready yet", run.Namespace, run.Name, phase)
		if run.Status.Reason != "" {
			msg += " (" + run.Status.Reason + ")"
		}
		return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "%s", msg), NotReadyRetry)
	}
	return nil
}

// Execable is the one rule both modes' ExecRouters apply: exec needs a
// running task or a Ready function.
func Execable(run *v1alpha1.Run) error {
	if p := run.Status.Phase; p != v1alpha1.PhaseRunning && p != v1alpha1.PhaseReady {
		return errdefs.Errorf(errdefs.ErrNotRunning, "run %s/%s is %s: exec needs a running task or a Ready function", run.Namespace, run.Name, p)
	}
	return nil
}

// PodGone is the error of a Run whose pod is gone: Unavailable with a
// Retry-After, as the Run is given another pod.
func PodGone(run *v1alpha1.Run) error {
	return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
		"run %s/%s: its pod %s is gone", run.Namespace, run.Name, run.Status.AssignedPod), NotReadyRetry)
}
