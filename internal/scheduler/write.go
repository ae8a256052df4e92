package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
)

type jobKind int

const (
	// jobAssign writes the assignment to pod.
	jobAssign jobKind = iota
	// jobCancel ends a cancelled Pending Run.
	jobCancel
	// jobUnschedulable writes phase Pending and Scheduled=False.
	jobUnschedulable
	// jobRuntimeCheck reads the Runtime from the store and fails the Run
	// when it is missing.
	jobRuntimeCheck
	// jobPinnedGone ends a Run pinned to a pod that is not there.
	jobPinnedGone
	// jobPinnedWaiting writes Scheduled=False, WaitingForPod: a pinned
	// Run waits for its full pod.
	jobPinnedWaiting
	// jobHeld writes phase Pending and Scheduled=False, Held: spec.held
	// keeps the Run back.
	jobHeld
)

// job is one status write for one Run. run is the informer's shared copy
// the decision was made on; the worker writes a deep copy of it.
type job struct {
	kind    jobKind
	rs      *runState
	run     *v1alpha1.Run
	pod     podsource.Pod
	message string
	since   time.Time
}

// result is a finished job. stored is the Run as written (nil when the job
// wrote nothing).
type result struct {
	job
	stored *v1alpha1.Run
	err    error
}

// do runs j on a worker goroutine. It touches no scheduler state.
func (s *Scheduler) do(ctx context.Context, j job) result {
	r := result{job: j}
	run := j.run.DeepCopy()
	now := s.clk.Now()
	switch j.kind {
	case jobAssign:
		assign(run, j.pod, now)
	case jobCancel:
		retry.Apply(run, retry.Decide(run, retry.Cancelled, "cancelled before it was scheduled", now))
	case jobUnschedulable, jobPinnedWaiting, jobHeld:
		reason := ReasonUnschedulable
		switch j.kind {
		case jobPinnedWaiting:
			reason = ReasonWaitingForPod
		case jobHeld:
			reason = ReasonHeld
		}
		run.Status.Phase = v1alpha1.PhasePending
		meta.SetStatusCondition(&run.Status.Conditions, metav1.Condition{
			Type: ConditionScheduled, Status: metav1.ConditionFalse, Reason: reason,
			Message: j.message, ObservedGeneration: run.Generation, LastTransitionTime: metav1.NewTime(now),
		})
	case jobPinnedGone:
		retry.Apply(run, retry.Decide(run, retry.Unschedulable, j.message, now))
	case jobRuntimeCheck:
		_, err := s.cfg.Runtimes.Get(ctx, run.Namespace, run.Spec.Runtime)
		if err == nil {
			return r // it exists: nothing to write
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			r.err = fmt.Errorf("read runtime %s: %w", run.Spec.Runtime, err)
			return r
		}
		msg := fmt.Sprintf("runtime %q does not exist in namespace %s", run.Spec.Runtime, run.Namespace)
		retry.Apply(run, retry.Decide(run, RuntimeNotFound, msg, now))
	}
	r.stored, r.err = s.cfg.Runs.UpdateStatus(ctx, run)
	switch {
	case r.err == nil && j.kind == jobAssign && s.cfg.OnScheduled != nil:
		s.cfg.OnScheduled(r.stored, s.clk.Since(j.since))
	case r.err == nil && j.kind == jobUnschedulable && s.cfg.OnUnschedulable != nil:
		s.cfg.OnUnschedulable(r.stored)
	case j.kind == jobAssign && errors.Is(r.err, errdefs.ErrConflict) && s.cfg.OnConflict != nil:
		s.cfg.OnConflict(j.run)
	}
	return r
}

// assign makes run Scheduled on pod.
func assign(run *v1alpha1.Run, pod podsource.Pod, now time.Time) {
	placement.Assign(run, pod.Name, pod.UID, now)
}

// write hands a status write for rs to the workers.
func (s *Scheduler) write(ctx context.Context, rs *runState, run *v1alpha1.Run, j job) {
	rs.busy = true
	j.rs, j.run, j.since = rs, run, rs.since
	s.loop.Submit(ctx, func(ctx context.Context) result { return s.do(ctx, j) })
}

// handleResult takes a finished write back into the state.
func (s *Scheduler) handleResult(ctx context.Context, r result) {
	rs := r.rs
	if r.kind == jobUnschedulable {
		s.unschedWriting--
		for k, p := range s.pools { // the marking goes on where it waited
			if len(p.due) > 0 {
				s.dirty[k] = struct{}{}
			}
		}
	}
	if s.runs[rs.key] != rs {
		return // ended or replaced meanwhile
	}
	rs.busy = false
	base := r.run.ResourceVersion
	switch {
	case r.err == nil && r.kind == jobRuntimeCheck && r.stored == nil:
		// The Runtime exists; the informer has not caught up.
		s.pool(rs.pool).runtimeConfirmed = true
	case r.err == nil:
		if r.stored.ResourceVersion == base {
			// Nothing changed, so no event will come.
			break
		}
		if r.kind == jobAssign {
			s.log.Debug("scheduler: assigned", "run", rs.key.String(), "run_uid", rs.uid, "pod", r.pod.Name)
		}
		if rs.rv == base {
			rs.holdRV = base // decide again once the informer shows the write
		}
	case errors.Is(r.err, errdefs.ErrConflict) || errors.Is(r.err, errdefs.ErrNotFound):
		if errors.Is(r.err, errdefs.ErrNotFound) {
			s.dropHint(rs.key, rs.uid) // deleted before the informer showed it
		}
		if rs.rv == base {
			rs.holdRV = base
		}
	case ctx.Err() != nil:
		return
	default:
		s.log.Warn("scheduler: status write failed", "run", rs.key.String(), "run_uid", rs.uid, "error", r.err)
		rs.retryAt = s.clk.Now().Add(errorBackoff)
	}
	if r.err != nil && rs.reserved != "" && rs.reservedBase == base {
		rs.reserved, rs.reservedBase = "", ""
	}
	s.sync(ctx, rs.key)
}
