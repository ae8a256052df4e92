package runtimed

import (
	"context"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// readyClaim is the claim of a function Run that may be written together
// with its Ready (Scheduled → Ready, one API write where there were two,
// which a scale from zero waits for): it waits for the registration, at
// most Config.RunningAfter from when runtimed took the Run. Past that the
// claim goes alone (Scheduled → Running), as it would have at once, so a
// long registration never leaves the Run looking unheld for longer than a
// deferred task's claim does: the reaper and the CLI read Running as held.
// Whichever comes first (the registration taking the claim, or the bound
// sending it) decides, once.
type readyClaim struct {
	w       *worker
	ctx     context.Context
	now     metav1.Time
	claimed chan *v1alpha1.Run // the claim alone's result, once sent

	once  sync.Once
	mu    sync.Mutex // guards timer, which may fire before it is set
	timer *time.Timer
}

// holdClaim reports whether run's claim may wait for its registration: a
// function Run runtimed takes afresh in Kubernetes mode (RunningAfter),
// created holding runtimed's finalizer (a Function's replica), since a Run
// is marked Ready only once it holds the finalizer, whose write comes
// after the claim.
func (w *worker) holdClaim(run *v1alpha1.Run) bool {
	return w.d.cfg.RunningAfter > 0 && !w.adopted && run.Spec.Mode.Function != nil &&
		run.DeletionTimestamp == nil && slices.Contains(run.Finalizers, Finalizer)
}

// newReadyClaim arms the bound; claimed receives the claim alone's result
// once it was sent.
func (w *worker) newReadyClaim(ctx context.Context, now metav1.Time, claimed chan *v1alpha1.Run) *readyClaim {
	c := &readyClaim{w: w, ctx: ctx, now: now, claimed: claimed}
	c.mu.Lock()
	c.timer = time.AfterFunc(w.d.cfg.RunningAfter, c.send)
	c.mu.Unlock()
	return c
}

// send writes the claim alone, unless it was sent or taken already.
func (c *readyClaim) send() {
	c.once.Do(func() {
		c.stopTimer()
		go func() { c.claimed <- c.w.claim(c.ctx, c.now) }()
	})
}

// take keeps the claim for the write with Ready; false if it went alone
// already.
func (c *readyClaim) take() bool {
	took := false
	c.once.Do(func() {
		c.stopTimer()
		took = true
	})
	return took
}

func (c *readyClaim) stopTimer() {
	c.mu.Lock()
	c.timer.Stop()
	c.mu.Unlock()
}

// claimReady writes the Run claimed and Ready at once (Scheduled → Ready,
// with startTime and the endpoint; a Run placed here at its create goes
// from nothing written to Ready, assigned in the same write) and returns what was stored, or nil
// when the Run moved on (reassigned, ended) or the write failed: as a
// refused claim, the registration is then ended. A Run being deleted
// meanwhile is claimed as the claim alone would: runFunction then sees the
// delete, lets the registration go and removes the finalizer.
func (w *worker) claimReady(ctx context.Context, took metav1.Time) *v1alpha1.Run {
	now := metav1.NewTime(w.d.cfg.Now())
	updated, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		if !slices.Contains(r.Finalizers, Finalizer) || !w.assigned(r, took) {
			return false
		}
		setClaimed(r, took)
		w.setReady(r, now)
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("claiming run ready", "error", err)
	}
	if updated != nil {
		w.logReady(updated, now.Time, true)
	}
	return updated
}
