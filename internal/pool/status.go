package pool

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// Status writing bounds.
const (
	// statusWriteTimeout bounds one status write, conflict retries included
	// (store.RetryOnConflict; a write that still conflicts is retried after
	// statusRetry).
	statusWriteTimeout = 10 * time.Second
	// statusFinalTimeout bounds the last writes when Run ends.
	statusFinalTimeout = 5 * time.Second
	// statusRetry is the pause before a failed write is tried again.
	statusRetry = time.Second
)

// statusUpdate is the part of a Runtime's status the supervisor owns, for
// the Runtime object with uid.
type statusUpdate struct {
	uid   types.UID
	ready int32
	pods  []v1alpha1.PodStatus
}

// statusWriter writes Runtime statuses from its own goroutine, so a slow
// store never holds up the pods. Only the latest status per Runtime is
// kept, so a burst of changes becomes one write.
type statusWriter struct {
	res store.Resource[*v1alpha1.Runtime]
	log *slog.Logger
	clk clock.Clock

	mu      sync.Mutex
	pending map[rtKey]statusUpdate

	wake    chan struct{} // cap 1
	quit    chan struct{}
	quitOne sync.Once
}

func newStatusWriter(res store.Resource[*v1alpha1.Runtime], log *slog.Logger, clk clock.Clock) *statusWriter {
	return &statusWriter{
		res:     res,
		log:     log,
		clk:     clk,
		pending: make(map[rtKey]statusUpdate),
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
	}
}

// submit replaces the status waiting to be written for key.
func (w *statusWriter) submit(key rtKey, u statusUpdate) {
	w.mu.Lock()
	w.pending[key] = u
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close makes run write what is pending, within statusFinalTimeout, and
// return.
func (w *statusWriter) close() { w.quitOne.Do(func() { close(w.quit) }) }

// run writes submitted statuses until close.
func (w *statusWriter) run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	retry := w.clk.NewTimer(statusRetry)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-w.wake:
		case <-retry.C():
		case <-w.quit:
			final, cancelFinal := context.WithTimeout(ctx, statusFinalTimeout)
			w.flush(final, false)
			cancelFinal()
			return
		}
		if !w.flush(ctx, true) {
			retry.Reset(statusRetry)
		}
	}
}

// flush writes everything pending. With requeue, a write that failed is
// put back (unless a newer status came meanwhile); flush then reports
// false.
func (w *statusWriter) flush(ctx context.Context, requeue bool) bool {
	w.mu.Lock()
	batch := w.pending
	w.pending = make(map[rtKey]statusUpdate)
	w.mu.Unlock()
	ok := true
	for key, u := range batch {
		wctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
		err := w.write(wctx, key, u)
		cancel()
		if err == nil {
			continue
		}
		w.log.Warn("cannot write runtime status", "runtime", key.String(), "err", err)
		if requeue {
			ok = false
			w.mu.Lock()
			if _, newer := w.pending[key]; !newer {
				w.pending[key] = u
			}
			w.mu.Unlock()
		}
	}
	return ok
}

// write sets the supervisor's part of the status of the Runtime key, if it
// is still the object u is for, re-reading on conflicts.
func (w *statusWriter) write(ctx context.Context, key rtKey, u statusUpdate) error {
	return store.RetryOnConflict(func() error {
		rt, err := w.res.Get(ctx, key.namespace, key.name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if rt.UID != u.uid || statusEqual(&rt.Status, u) {
			return nil
		}
		rt.Status.ReadyPods = u.ready
		rt.Status.Pods = u.pods
		if _, err = w.res.UpdateStatus(ctx, rt); errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	})
}

// statusEqual reports whether st already says what u says, heartbeats
// compared to the second (what the API keeps).
func statusEqual(st *v1alpha1.RuntimeStatus, u statusUpdate) bool {
	if st.ReadyPods != u.ready || len(st.Pods) != len(u.pods) {
		return false
	}
	for i, a := range st.Pods {
		b := u.pods[i]
		if a.Name != b.Name || a.UID != b.UID || a.Ready != b.Ready || a.Address != b.Address {
			return false
		}
		if (a.LastHeartbeat == nil) != (b.LastHeartbeat == nil) {
			return false
		}
		if a.LastHeartbeat != nil && a.LastHeartbeat.Unix() != b.LastHeartbeat.Unix() {
			return false
		}
	}
	return true
}
