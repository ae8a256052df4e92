package reaper

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
)

// ttlDeadline returns when run is to be deleted, if it is: its own TTL
// wins over the server's.
func (r *Reaper) ttlDeadline(run *v1alpha1.Run) (time.Time, bool) {
	st := run.Status
	if !st.Phase.Terminal() || st.CompletionTime == nil || run.DeletionTimestamp != nil {
		return time.Time{}, false
	}
	if ttl := run.Spec.TTLSecondsAfterFinished; ttl != nil {
		return st.CompletionTime.Add(time.Duration(*ttl) * time.Second), true
	}
	if r.cfg.FinishedRunTTL > 0 {
		return st.CompletionTime.Add(r.cfg.FinishedRunTTL), true
	}
	return time.Time{}, false
}

// trackTTL keeps run's entry in the TTL heap current.
func (r *Reaper) trackTTL(run *v1alpha1.Run) {
	at, ok := r.ttlDeadline(run)
	old, had := r.ttlAt[run.UID]
	k := ttlKey(informer.KeyOf(run), run.UID)
	switch {
	case !ok:
		if had {
			delete(r.ttlAt, run.UID)
			r.loop.Stop(k)
		}
	case !had || !old.Equal(at):
		r.ttlAt[run.UID] = at
		r.loop.Set(at, k)
	}
}

// expire deletes a Run whose TTL passed, if the informer agrees.
func (r *Reaper) expire(ctx context.Context, key informer.Key, uid types.UID) {
	run, ok := r.cfg.RunInformer.Get(key.Namespace, key.Name)
	if !ok || run.UID != uid {
		return
	}
	if at, ok := r.ttlDeadline(run); !ok || at.After(r.clk.Now()) {
		r.trackTTL(run)
		return
	}
	err := r.cfg.Runs.Delete(ctx, key.Namespace, key.Name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(uid)}})
	switch {
	case err == nil:
		r.log.Info("reaper: deleted finished run after its TTL", "run", key.String(), "run_uid", uid)
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
	case ctx.Err() != nil:
	default:
		r.log.Warn("reaper: TTL delete failed, will try again", "run", key.String(), "run_uid", uid, "error", err)
		at := r.clk.Now().Add(errorBackoff)
		r.ttlAt[uid] = at
		r.loop.Set(at, ttlKey(key, uid))
	}
}
