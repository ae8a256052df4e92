package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
)

// RestartSummary counts what RecoverRestart did.
type RestartSummary struct {
	// Requeued Runs are Pending again with their attempt unchanged.
	Requeued int
	// Recovered Runs went through the retry engine with reason PodGone.
	Recovered int
	// Released Runs being deleted lost runtimed's finalizer.
	Released int
}

// RecoverRestart settles, in the store, every Run that the previous
// process left assigned to a pod: call it once, before Run and before the
// API serves, when no pod a Run can be assigned to is alive — in
// standalone mode, at the start of a process whose pool supervisor has not
// started a pod yet (the previous process's pods died with it or are
// killed by the new supervisor before it starts any). So nobody is shown a
// Run Ready, Running or Scheduled on a pod that no longer exists, and the
// reaper's grace for unknown pods is not waited out.
//
// The restart of Stoke is not the Run's failure, so what can be done again
// without running anything twice is requeued without spending an attempt:
//
//   - a function Run (Scheduled, Running or Ready) becomes Pending with the
//     same status.attempt, reason Restarted ([retry.Requeue]), its Scheduled and Ready
//     conditions False; status.startTime (its reservation lifetime counts
//     from the first start) and status.endpoint (it is registered again at
//     the same URL) are kept;
//   - a task that was only Scheduled — runtimed claims a task (writes
//     Running) before it hands it to its Runtime Server, so none of it ran —
//     becomes Pending the same way.
//
// A Running task may have run in part, so it goes through the retry engine
// with reason PodGone, as the loss of any pod does: another attempt if its
// policy allows one, else Failed/PodGone. A Run with cancelRequested ends
// Cancelled. A Run being deleted loses runtimed's finalizer, which no
// runtimed will remove now.
func (r *Reaper) RecoverRestart(ctx context.Context) (RestartSummary, error) {
	var sum RestartSummary
	runs, _, err := r.cfg.Runs.List(ctx, store.ListOptions{})
	if err != nil {
		return sum, fmt.Errorf("restart: list runs: %w", err)
	}
	var errs []error
	for _, run := range runs {
		deleting := run.DeletionTimestamp != nil && slices.Contains(run.Finalizers, RuntimedFinalizer)
		var count *int
		switch {
		case deleting:
			uid := run.Status.AssignedPodUID
			err, count = r.releaseFinalizer(ctx, run, func(run *v1alpha1.Run) bool { return run.Status.AssignedPodUID == uid }), &sum.Released
		case run.Status.Phase.Terminal() || run.Status.AssignedPodUID == "":
			continue
		case requeueable(run):
			err, count = r.requeue(ctx, run), &sum.Requeued
		default:
			err, count = r.recover(ctx, run, restartMessage), &sum.Recovered
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*count++
	}
	return sum, errors.Join(errs...)
}

// requeueable reports whether run, assigned to a pod that died with the
// previous process, can be assigned again without spending an attempt.
func requeueable(run *v1alpha1.Run) bool {
	if run.Spec.CancelRequested {
		return false
	}
	return run.Spec.Mode.Function != nil || run.Status.Phase == v1alpha1.PhaseScheduled
}

// requeue makes run Pending again with its attempt unchanged (see
// RecoverRestart), re-reading it on a conflict.
func (r *Reaper) requeue(ctx context.Context, run *v1alpha1.Run) error {
	var recoverInstead bool
	err := r.settleAssigned(ctx, run, func(run *v1alpha1.Run) (*v1alpha1.Run, func(*v1alpha1.Run)) {
		if !requeueable(run) {
			recoverInstead = true
			return nil, nil
		}
		next := run.DeepCopy()
		st := &next.Status
		what := "registering it again on a new pod"
		if next.Spec.Mode.Function == nil {
			what = "the task had not started; scheduling it again"
		}
		msg := bounds.Truncate(fmt.Sprintf("Stoke restarted while the run was %s on pod %s; %s (attempt %d, not counted as a failure)",
			phaseName(st.Phase), st.AssignedPod, what, max(st.Attempt, 1)), bounds.Message)
		retry.Requeue(next, retry.Restarted, msg, r.clk.Now())
		return next, func(stored *v1alpha1.Run) {
			r.log.Info("reaper: requeued a run after a restart", "run", informer.KeyOf(run).String(), "run_uid", run.UID,
				"pod_uid", run.Status.AssignedPodUID, "attempt", stored.Status.Attempt)
		}
	})
	if err != nil {
		return fmt.Errorf("requeue run %s after a restart: %w", informer.KeyOf(run), err)
	}
	if recoverInstead {
		return r.recover(ctx, run, restartMessage)
	}
	return nil
}

// restartMessage is the failure message of a Run lost with the previous
// process's pod.
func restartMessage(run *v1alpha1.Run) string {
	return fmt.Sprintf("Stoke restarted while the run was %s on pod %s (uid %s)",
		phaseName(run.Status.Phase), run.Status.AssignedPod, run.Status.AssignedPodUID)
}
