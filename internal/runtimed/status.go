package runtimed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
)

// setStatus applies mutate to the freshest copy of the Run and writes it
// with optimistic concurrency, re-reading on conflict. mutate returns false
// when the change no longer applies (the Run moved on); setStatus then
// returns nil. A Run not assigned to this pod (nor placed here at its
// create and not written yet), or terminal, is never changed.
func (w *worker) setStatus(ctx context.Context, mutate func(*v1alpha1.Run) bool) (*v1alpha1.Run, error) {
	// Every attempt mutates its own copy of the freshest Run known, so
	// that an attempt that failed leaves nothing behind for the next.
	base, _ := w.current()
	var updated *v1alpha1.Run
	err := w.whileStoreUnavailable(ctx, ctx, "runs/status", func(ctx context.Context) error {
		return store.RetryOnConflict(func() error {
			run := base.DeepCopy()
			if !w.d.holds(run) || run.Status.Phase.Terminal() || !mutate(run) {
				return nil
			}
			w.hidePaths(&run.Status)
			u, err := w.d.cfg.Runs.UpdateStatus(ctx, run)
			if err == nil {
				w.wrote(base, u)
				updated = u
				return nil
			}
			if errors.Is(err, errdefs.ErrNotFound) {
				return w.goneOrWait(err)
			}
			if !errors.Is(err, errdefs.ErrConflict) {
				return err
			}
			fresh, gerr := w.d.cfg.Runs.Get(ctx, run.Namespace, run.Name)
			if gerr != nil {
				if errors.Is(gerr, errdefs.ErrNotFound) {
					return w.goneOrWait(gerr)
				}
				return fmt.Errorf("re-read after conflict: %w", gerr)
			}
			if string(fresh.UID) != w.uid {
				return nil // a new Run of the same name
			}
			base = fresh
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: update status: %w", w.uid, err)
	}
	return updated, nil
}

// goneOrWait decides what a NotFound from the store means for this Run:
// nothing to write when the informer has reported the Run gone, else a
// reason to try again (an error wrapping errdefs.ErrUnavailable). An API
// server that is starting answers NotFound for a custom resource it does
// not serve yet; a Run that is really gone reaches the worker from the
// informer (OnDelete).
func (w *worker) goneOrWait(err error) error {
	if _, gone := w.current(); gone {
		return nil
	}
	return fmt.Errorf("run %s: the store says %w, its informer has not seen it go: %w", w.uid, err, errdefs.ErrUnavailable)
}

// fail sends a failure through the retry engine and records its decision.
func (w *worker) fail(ctx context.Context, reason retry.Reason, message string) {
	_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		d := retry.Decide(r, reason, bounds.Truncate(message, bounds.Message), w.d.cfg.Now())
		retry.Apply(r, d)
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("recording failure", "reason", reason, "error", err)
	}
	w.log.Info("run failed", "reason", reason, "message", bounds.Truncate(message, 512))
}

// finish records a terminal phase that is not a failure to retry.
func (w *worker) finish(ctx context.Context, phase v1alpha1.Phase, reason, message string, edit func(*v1alpha1.Run)) {
	now := metav1.NewTime(w.d.cfg.Now())
	_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		r.Status.Phase = phase
		r.Status.Reason = reason
		r.Status.Message = bounds.Truncate(message, bounds.Message)
		r.Status.CompletionTime = &now
		if edit != nil {
			edit(r)
		}
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("recording completion", "phase", phase, "error", err)
	}
}

// whileUnavailable calls f until it returns anything but Unavailable. The
// pod's own Runtime Server is unavailable only while it restarts or dies;
// the calls runtimed makes are idempotent (Execute and Register by ID and
// attempt) or reads, and runtimed's context ends when the pod is declared
// gone — then the reaper, not runtimed, decides the Run's fate.
func whileUnavailable(ctx context.Context, f func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := f()
		if status.Code(err) != codes.Unavailable {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// storeCallTimeout bounds one attempt at a store write (with the reads of
// its conflict retries): a request to an API server that went away, or
// that accepted it while starting, may otherwise never be answered.
const storeCallTimeout = 10 * time.Second

// whileStoreUnavailable calls f, with a context derived from call and
// bounded by storeCallTimeout, until the store answers it: while the store
// is unreachable (errdefs.ErrUnavailable, or a call that ran out of time —
// the API server is down or restarting) or refuses it (see storeDown) it
// tries again with backoff until wait ends. runtimed's writes are the only
// record of what happened on the pod (a task's exit and outputs, a
// function's registration), so they wait for the store rather than being
// lost. A refusal is logged, with resource (what f writes) and the error,
// when it begins or changes and once when it ends: past an API server's
// start it means runtimed's RBAC or credentials are wrong, and retried in
// silence it would leave the Run stuck with nothing saying why.
func (w *worker) whileStoreUnavailable(wait, call context.Context, resource string, f func(ctx context.Context) error) error {
	backoff := 50 * time.Millisecond
	var refused error // the refusal's category while one is being retried
	for {
		ctx, cancel := context.WithTimeout(call, storeCallTimeout)
		err := f(ctx)
		cancel()
		if r := refusal(err); r != refused {
			if r != nil {
				w.log.Error("the store refuses runtimed's write; retrying (check runtimed's RBAC and its Pod's ServiceAccount token)",
					"resource", resource, "error", err)
			} else {
				w.log.Info("the store no longer refuses runtimed's write", "resource", resource, "error", err)
			}
			refused = r
		}
		if !storeDown(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-wait.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// refusal is err's category when the store refused the call (401, 403),
// nil otherwise.
func refusal(err error) error {
	for _, c := range []error{errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated} {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

// storeDown reports whether err says the store could not be reached, or
// refused the call: a kube-apiserver that has just started answers 401 and
// 403 until its authenticator and RBAC authorizer have synced, and a claim
// refused then would leave its Run Scheduled for good.
func storeDown(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrDeadlineExceeded) || refusal(err) != nil
}
