package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
)

type goneInfo struct {
	pod    podsource.Pod
	reason string
	at     time.Time
}

// drainPods applies the pod events already waiting.
func (r *Reaper) drainPods(ctx context.Context, events <-chan podsource.Event) {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			r.podEvent(ctx, ev)
		default:
			return
		}
	}
}

func (r *Reaper) podEvent(ctx context.Context, ev podsource.Event) {
	switch ev.Type {
	case podsource.PodReady:
		r.live[ev.Pod.UID] = ev.Pod
	case podsource.PodGone:
		delete(r.live, ev.Pod.UID)
		r.gone[ev.Pod.UID] = goneInfo{pod: ev.Pod, reason: ev.Reason, at: r.clk.Now()}
		uid := ev.Pod.UID
		runs := r.cfg.RunInformer.List(func(run *v1alpha1.Run) bool { return run.Status.AssignedPodUID == uid })
		if len(runs) > 0 {
			r.log.Info("reaper: pod gone, recovering its runs", "pod", ev.Pod.Name, "pod_uid", uid, "reason", ev.Reason, "runs", len(runs))
		}
		for _, run := range runs {
			r.check(ctx, run)
		}
	}
}

// podGone reports whether uid is not a live pod, and whether it is known
// to be gone (rather than never heard of).
func (r *Reaper) podGone(uid string) (notLive, knownGone bool) {
	if _, ok := r.live[uid]; ok {
		return false, false
	}
	_, known := r.gone[uid]
	return true, known
}

// check treats run if its pod is gone: it needs recovery when it is not
// terminal, or the removal of runtimed's finalizer when it is being
// deleted.
func (r *Reaper) check(ctx context.Context, run *v1alpha1.Run) {
	deleting := run.DeletionTimestamp != nil && slices.Contains(run.Finalizers, RuntimedFinalizer)
	assigned := run.Status.AssignedPodUID
	if !deleting && (run.Status.Phase.Terminal() || assigned == "") {
		delete(r.orphans, run.UID)
		return
	}
	if deleting && neverHeld(run) {
		// Created with the finalizer (a Function's replica) and deleted
		// before any runtimed claimed it: none will remove it.
		delete(r.orphans, run.UID)
		if err := r.releaseFinalizer(ctx, run, neverHeld); err != nil && ctx.Err() == nil {
			r.log.Warn("reaper: write failed, will try again", "run", informer.KeyOf(run).String(), "run_uid", run.UID, "error", err)
			r.loop.After(r.clk.Now().Add(errorBackoff), loopKey{kind: keyRun, Key: informer.KeyOf(run)})
		}
		return
	}
	if assigned != "" {
		notLive, known := r.podGone(assigned)
		if !notLive {
			delete(r.orphans, run.UID)
			return
		}
		if !known && r.cfg.OrphanGrace > 0 {
			now := r.clk.Now()
			first, seen := r.orphans[run.UID]
			if !seen {
				first = now
				r.orphans[run.UID] = now
			}
			if due := first.Add(r.cfg.OrphanGrace); now.Before(due) {
				r.loop.After(due, loopKey{kind: keyRun, Key: informer.KeyOf(run)})
				return
			}
		}
	}
	delete(r.orphans, run.UID)
	var err error
	if deleting {
		uid := run.Status.AssignedPodUID
		err = r.releaseFinalizer(ctx, run, func(run *v1alpha1.Run) bool { return run.Status.AssignedPodUID == uid })
	} else {
		err = r.recover(ctx, run, r.goneMessage)
	}
	if err != nil && ctx.Err() == nil {
		r.log.Warn("reaper: write failed, will try again", "run", informer.KeyOf(run).String(), "run_uid", run.UID, "error", err)
		r.loop.After(r.clk.Now().Add(errorBackoff), loopKey{kind: keyRun, Key: informer.KeyOf(run)})
	}
}

// recover sends run, assigned to a pod that is gone, through the retry
// engine. On a conflict it re-reads the Run and decides again; it writes
// nothing once the Run is terminal or assigned elsewhere.
func (r *Reaper) recover(ctx context.Context, run *v1alpha1.Run, message func(*v1alpha1.Run) string) error {
	err := r.settleAssigned(ctx, run, func(run *v1alpha1.Run) (*v1alpha1.Run, func(*v1alpha1.Run)) {
		d := retry.Decide(run, retry.PodGone, message(run), r.clk.Now())
		next := run.DeepCopy()
		retry.Apply(next, d)
		return next, func(stored *v1alpha1.Run) {
			r.log.Info("reaper: recovered run of a gone pod", "run", informer.KeyOf(run).String(), "run_uid", run.UID,
				"pod_uid", run.Status.AssignedPodUID, "phase", stored.Status.Phase, "attempt", stored.Status.Attempt, "retry", d.Retry)
		}
	})
	if err != nil {
		return fmt.Errorf("recover run %s: %w", informer.KeyOf(run), err)
	}
	return nil
}

// settleAssigned writes the status that change returns for run, still assigned
// to the pod it is assigned to now, and logs with the returned func on
// success. On a conflict it re-reads the Run and asks change again; it
// writes nothing once the Run is terminal, assigned elsewhere, being
// deleted or gone, or when change returns nil.
func (r *Reaper) settleAssigned(ctx context.Context, run *v1alpha1.Run,
	change func(run *v1alpha1.Run) (next *v1alpha1.Run, logged func(stored *v1alpha1.Run))) error {
	uid := run.Status.AssignedPodUID
	return store.RetryOnConflict(func() error {
		if run.Status.Phase.Terminal() || run.Status.AssignedPodUID != uid || run.DeletionTimestamp != nil {
			return nil
		}
		next, logged := change(run)
		if next == nil {
			return nil
		}
		stored, err := r.cfg.Runs.UpdateStatus(ctx, next)
		if err == nil {
			logged(stored)
			return nil
		}
		fresh, rerr := r.reread(ctx, run, err)
		if fresh == nil {
			return rerr
		}
		run = fresh
		return err // the conflict: decide again
	})
}

// neverHeld reports whether no runtimed holds run nor will: it waits for a
// pod (no phase, or Pending: runtimed takes only Scheduled Runs, and the
// scheduler assigns no Run being deleted), or it ended without a claim
// (runtimed's claim sets startTime).
func neverHeld(run *v1alpha1.Run) bool {
	switch p := run.Status.Phase; {
	case p == "" || p == v1alpha1.PhasePending:
		return true
	case p.Terminal():
		return run.Status.StartTime == nil
	}
	return false
}

// releaseFinalizer removes runtimed's finalizer from a Run being deleted
// that no runtimed will release (its pod is gone, or it was never held),
// so the deletion can complete. still is asked again of the stored Run
// after a conflict: the write goes only while it holds.
func (r *Reaper) releaseFinalizer(ctx context.Context, run *v1alpha1.Run, still func(*v1alpha1.Run) bool) error {
	uid := run.Status.AssignedPodUID
	err := store.RetryOnConflict(func() error {
		if !slices.Contains(run.Finalizers, RuntimedFinalizer) || !still(run) {
			return nil
		}
		next := run.DeepCopy()
		next.Finalizers = slices.DeleteFunc(next.Finalizers, func(f string) bool { return f == RuntimedFinalizer })
		_, err := r.cfg.Runs.Update(ctx, next)
		if err == nil {
			r.log.Info("reaper: released the finalizer of a deleted run no runtimed holds", "run", informer.KeyOf(run).String(), "run_uid", run.UID, "pod_uid", uid, "phase", run.Status.Phase)
			return nil
		}
		fresh, rerr := r.reread(ctx, run, err)
		if fresh == nil {
			return rerr
		}
		run = fresh
		return err // the conflict: decide again
	})
	if err != nil {
		return fmt.Errorf("release finalizer of run %s: %w", informer.KeyOf(run), err)
	}
	return nil
}

// reread handles a failed write of run: on a conflict it returns the
// stored Run (same UID) to decide again; otherwise, or when the Run is
// gone, nil with the error to report (nil when there is nothing left to
// do).
func (r *Reaper) reread(ctx context.Context, run *v1alpha1.Run, err error) (*v1alpha1.Run, error) {
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if !errors.Is(err, errdefs.ErrConflict) {
		return nil, err
	}
	fresh, gerr := r.cfg.Runs.Get(ctx, run.Namespace, run.Name)
	if errors.Is(gerr, errdefs.ErrNotFound) {
		return nil, nil
	}
	if gerr != nil {
		return nil, gerr
	}
	if fresh.UID != run.UID {
		return nil, nil
	}
	return fresh, nil
}

func (r *Reaper) goneMessage(run *v1alpha1.Run) string {
	uid := run.Status.AssignedPodUID
	if g, ok := r.gone[uid]; ok {
		reason := g.reason
		if reason == "" {
			reason = "gone"
		}
		return fmt.Sprintf("pod %s (uid %s) is gone (%s) while the run was %s", g.pod.Name, uid, reason, phaseName(run.Status.Phase))
	}
	return fmt.Sprintf("pod %s (uid %s) is not a live pod while the run was %s", run.Status.AssignedPod, uid, phaseName(run.Status.Phase))
}

func phaseName(p v1alpha1.Phase) string {
	if p == "" {
		return string(v1alpha1.PhasePending)
	}
	return string(p)
}

// sweep checks every Run against the live pods and forgets old gone UIDs.
func (r *Reaper) sweep(ctx context.Context) {
	now := r.clk.Now()
	r.loop.Set(now.Add(r.cfg.SweepInterval), loopKey{kind: keySweep})
	for uid, g := range r.gone {
		if now.Sub(g.at) > goneMemory {
			delete(r.gone, uid)
		}
	}
	runs := r.cfg.RunInformer.List(func(run *v1alpha1.Run) bool {
		return run.Status.AssignedPodUID != "" || run.DeletionTimestamp != nil
	})
	for _, run := range runs {
		r.check(ctx, run)
	}
}
