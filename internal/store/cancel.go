package store

import (
	"context"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// RequestCancel sets the Run's spec.cancelRequested, unless it has ended
// or asked already, retrying on conflicts; it returns the Run as stored.
// runtimed (or, for a Pending Run, the scheduler) then ends it Cancelled.
func RequestCancel(ctx context.Context, runs Resource[*v1alpha1.Run], namespace, name string) (*v1alpha1.Run, error) {
	var out *v1alpha1.Run
	err := RetryOnConflict(func() error {
		run, err := runs.Get(ctx, namespace, name)
		if err != nil {
			return err
		}
		if run.Spec.CancelRequested || run.Status.Phase.Terminal() {
			out = run
			return nil
		}
		run.Spec.CancelRequested = true
		out, err = runs.Update(ctx, run)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RequestWorkflowCancel sets a WorkflowRun's spec.cancelRequested, unless
// it has ended or asked already, retrying on conflicts; it returns the
// WorkflowRun as stored. The workflow controller then cancels its running
// step Runs and skips the jobs that have not started.
func RequestWorkflowCancel(ctx context.Context, wfruns Resource[*v1alpha1.WorkflowRun], namespace, name string) (*v1alpha1.WorkflowRun, error) {
	var out *v1alpha1.WorkflowRun
	err := RetryOnConflict(func() error {
		w, err := wfruns.Get(ctx, namespace, name)
		if err != nil {
			return err
		}
		if w.Spec.CancelRequested || w.Status.Phase.Terminal() {
			out = w
			return nil
		}
		w.Spec.CancelRequested = true
		out, err = wfruns.Update(ctx, w)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReleaseHold clears the Run's spec.held (a Docker container's start),
// unless it is not held, retrying on conflicts; it returns the Run as
// stored. The scheduler then places it as any Pending Run.
func ReleaseHold(ctx context.Context, runs Resource[*v1alpha1.Run], namespace, name string) (*v1alpha1.Run, error) {
	var out *v1alpha1.Run
	err := RetryOnConflict(func() error {
		run, err := runs.Get(ctx, namespace, name)
		if err != nil {
			return err
		}
		if !run.Spec.Held {
			out = run
			return nil
		}
		run.Spec.Held = false
		out, err = runs.Update(ctx, run)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
