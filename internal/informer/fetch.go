package informer

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// CatchUp bounds how long Fetch waits for the cache to reach an object
// the store already has: an informer that lags longer is not healthy,
// and the caller is told to come back.
const CatchUp = 5 * time.Second

// errLagging is the cause of a Fetch's wait that ran out of CatchUp.
var errLagging = errors.New("informer: the cache lags the store")

// catchUpRetry is the Retry-After of a Fetch that waited CatchUp in vain.
const catchUpRetry = time.Second

// maxSeen bounds the versions one Fetch notes while it waits.
const maxSeen = 256

// Fetch returns the object namespace/name from the cache. On a miss it
// reads the store once: an object the store does not have is NotFound (a
// real miss); one it has was written a moment ago, and Fetch waits, woken
// by the cache's own changes (never by polling), until the cache has
// applied the version the store answered, then returns the cache's copy
// (that version or a later one), so that the caller acts on what the
// informer's handlers have seen too. Versions are matched, not ordered
// (Kubernetes calls them opaque): the wait notes every version of the
// object the cache applies from before the store is read. The wait is
// bounded by ctx and CatchUp; running out of CatchUp is Unavailable with
// a Retry-After.
//
// An object the informer does not select (Options.Phase,
// Options.AssignedPodUID) never reaches the cache: Fetch returns the
// store's copy at once, the caller's own.
//
// Only misses reach the store, so a hot path that hits the cache asks
// nothing of it. The object is shared: do not mutate it.
func (i *Informer[T]) Fetch(ctx context.Context, namespace, name string) (T, error) {
	if obj, ok := i.Get(namespace, name); ok {
		return obj, nil
	}
	var zero T
	k := Key{Namespace: defaultNamespace(namespace), Name: name}
	w := i.startWait(k)
	defer i.endWait(w)
	stored, err := i.res.Get(ctx, k.Namespace, name)
	if err != nil {
		return zero, err
	}
	if !i.selects(stored) {
		return stored, nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, CatchUp, errLagging)
	defer cancel()
	uid, rv := stored.GetUID(), stored.GetResourceVersion()
	for {
		// The cache may have held that version before the wait began.
		if obj, ok := i.Get(namespace, name); ok && obj.GetUID() == uid && obj.GetResourceVersion() == rv {
			return obj, nil
		}
		reached, gone := w.reached(uid, rv)
		if reached || gone {
			obj, ok := i.Get(namespace, name)
			if !ok || obj.GetUID() != uid {
				// Deleted (or replaced) since: gone after all.
				return zero, errdefs.Errorf(errdefs.ErrNotFound, "%s/%s was deleted", k.Namespace, name)
			}
			return obj, nil
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errLagging) {
				return zero, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
					"%s/%s exists, but this process has not caught up with it yet", k.Namespace, name), catchUpRetry)
			}
			return zero, ctx.Err()
		}
	}
}

// fetchWait is one Fetch's view of the changes the cache applies to its
// key while it waits.
type fetchWait struct {
	key  Key
	wake chan struct{} // capacity 1: a change since the last look

	mu sync.Mutex
	// seen are the versions applied by watch events; listed are the UIDs
	// a re-list put in the cache (a re-list may skip versions: its copy
	// is at least as new as the store's answer to a read made before it).
	seen   map[types.UID]map[string]bool
	listed map[types.UID]bool
	gone   map[types.UID]bool
	nseen  int
}

// reached says whether the cache has applied version rv of uid, or
// re-listed uid, since the wait began; gone, whether it deleted uid.
func (w *fetchWait) reached(uid types.UID, rv string) (reached, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[uid][rv] || w.listed[uid], w.gone[uid]
}

func (w *fetchWait) note(uid types.UID, rv string, listed, deleted bool) {
	w.mu.Lock()
	switch {
	case deleted:
		w.gone[uid] = true
	case listed:
		w.listed[uid] = true
	case w.nseen < maxSeen:
		if w.seen[uid] == nil {
			w.seen[uid] = map[string]bool{}
		}
		w.seen[uid][rv] = true
		w.nseen++
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (i *Informer[T]) startWait(k Key) *fetchWait {
	w := &fetchWait{key: k, wake: make(chan struct{}, 1), seen: map[types.UID]map[string]bool{}, listed: map[types.UID]bool{}, gone: map[types.UID]bool{}}
	i.waitMu.Lock()
	defer i.waitMu.Unlock()
	if i.waits == nil {
		i.waits = map[Key][]*fetchWait{}
	}
	i.waits[k] = append(i.waits[k], w)
	i.nwaits.Add(1)
	return w
}

func (i *Informer[T]) endWait(w *fetchWait) {
	i.waitMu.Lock()
	defer i.waitMu.Unlock()
	ws := i.waits[w.key]
	for n, x := range ws {
		if x == w {
			ws = append(ws[:n:n], ws[n+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(i.waits, w.key)
	} else {
		i.waits[w.key] = ws
	}
	i.nwaits.Add(-1)
}

// noteApplied tells the Fetches waiting for obj's key that the cache
// applied it (listed: from a re-list; deleted: its deletion). Cheap when
// none waits.
func (i *Informer[T]) noteApplied(obj T, listed, deleted bool) {
	if i.nwaits.Load() == 0 {
		return
	}
	k := KeyOf(obj)
	i.waitMu.Lock()
	defer i.waitMu.Unlock()
	for _, w := range i.waits[k] {
		w.note(obj.GetUID(), obj.GetResourceVersion(), listed, deleted)
	}
}

// selects says whether obj is in the set the informer watches: every
// object, or the Runs its Options select.
func (i *Informer[T]) selects(obj T) bool {
	run, ok := any(obj).(*v1alpha1.Run)
	if !ok {
		return true
	}
	return (i.opts.Phase == "" || run.Status.Phase == i.opts.Phase) &&
		(i.opts.AssignedPodUID == "" || run.Status.AssignedPodUID == i.opts.AssignedPodUID) &&
		(i.opts.PlacedPodUID == "" || (run.Spec.Placement != nil && run.Spec.Placement.PodUID == i.opts.PlacedPodUID))
}
