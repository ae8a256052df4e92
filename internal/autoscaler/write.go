package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
)

// write hands the decision's write to the workers.
func (a *Autoscaler) write(ctx context.Context, k informer.Key, fn *v1alpha1.Function, st *fnState, d decision) {
	st.busy, st.holdRV = true, fn.ResourceVersion
	st.expects = d.to > d.from && a.cfg.Expect != nil
	if st.expects {
		a.cfg.Expect(k.Namespace, k.Name, fn.UID, d.to)
	}
	seen := fn.DeepCopy()
	a.loop.Submit(ctx, func(ctx context.Context) result {
		scaled, err := a.scale(ctx, k, seen, d)
		return result{key: k, scaled: scaled, err: err}
	})
}

// scale writes spec.replicas of the Function seen (the informer's copy
// the decision was made on), so that a scale costs no read before its
// write (a scale from zero waits for it); a conflict (the copy was stale)
// is retried on a fresh read of the Function with seen's UID. Once it is
// written the decision goes to Config.Record, for the Function
// controller's next status write: the autoscaler makes no write of its
// own beside the path of a scale from zero. scaled: spec.replicas was
// written.
func (a *Autoscaler) scale(ctx context.Context, k informer.Key, seen *v1alpha1.Function, d decision) (scaled bool, err error) {
	to := int32(d.to)
	cur := seen
	err = store.RetryOnConflict(func() error {
		fn := cur
		if fn == nil {
			// A conflict: read it again.
			var err error
			if fn, err = a.cfg.Functions.Get(ctx, k.Namespace, k.Name); err != nil {
				return err
			}
			if fn.UID != seen.UID || fn.DeletionTimestamp != nil {
				return fmt.Errorf("function %s was replaced or is being deleted: %w", k, errdefs.ErrNotFound)
			}
		}
		cur = nil
		fn.Spec.Replicas = &to
		_, err := a.cfg.Functions.Update(ctx, fn)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("scale function %s to %d: %w", k, to, err)
	}
	reason := d.reason
	if len(reason) > bounds.ScaleReason {
		reason = reason[:bounds.ScaleReason]
	}
	a.cfg.Record(k.Namespace, k.Name, seen.UID, v1alpha1.ScaleDecision{
		Time: metav1.NewTime(d.at.Truncate(time.Second)), From: int32(d.from), To: to, Reason: reason})
	a.log.Info("autoscaler: scaled", "function", k.String(), "from", d.from, "to", d.to, "reason", d.reason)
	return true, nil
}

// handleResult takes a finished write back.
func (a *Autoscaler) handleResult(ctx context.Context, r result) {
	st := a.fns[r.key]
	if st == nil {
		return
	}
	st.busy = false
	if !r.scaled && st.expects {
		// The count is not on its way after all.
		a.cfg.Expect(r.key.Namespace, r.key.Name, types.UID(st.uid), 0)
	}
	st.expects = false
	switch {
	case r.err == nil:
		// Decide again once the informer shows the write (holdRV).
	case errors.Is(r.err, errdefs.ErrNotFound), ctx.Err() != nil:
		delete(a.fns, r.key)
		return
	default:
		a.log.Warn("autoscaler: write failed", "function", r.key.String(), "error", r.err)
		st.holdRV = ""
		st.retryAt = a.clk.Now().Add(errorBackoff)
	}
	a.sync(ctx, r.key)
}
