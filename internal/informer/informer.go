// Package informer is Stoke's list+watch cache: one per kind, shared by the
// control-plane components (scheduler, reaper, runtimed, later the
// gateway) instead of each running its own watch loop.
//
// An [Informer] lists a store.Resource, then watches it from the list's
// resourceVersion and keeps an in-memory copy of every object. Components
// read that copy ([Informer.Get], [Informer.List]) and register a
// [Handler] to hear about changes. When the watch ends — the store expired
// the history it needed, the consumer fell behind, the store restarted —
// the informer first tries to watch again from the last version it saw and,
// when that history is gone too, re-lists and reconciles: handlers hear
// OnAdd, OnUpdate and OnDelete only for objects that actually changed
// meanwhile, never again for unchanged ones.
//
// Handlers are called one at a time, in the order the changes were
// committed, after the cache reflects the change. They must be fast and
// must not block: a component copies what it needs (usually the object's
// [Key]) into its own queue (the control loops use internal/loop's) and
// does the work on its own goroutine.
//
// Objects handed out by the informer, to handlers and by Get and List, are
// shared by every reader and must be treated as read-only: DeepCopy before
// mutating one, e.g. to write its status.
package informer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/store"
)

// Handler hears about changes to the objects of an informer. Calls are
// serialised: never concurrent, in commit order, and made after the cache
// already reflects the change. They must not block and must not mutate the
// objects; they must not call AddEventHandler.
type Handler[T store.Object] interface {
	// OnAdd is called for an object the informer did not have.
	OnAdd(obj T)
	// OnUpdate is called when an object's resourceVersion changed.
	OnUpdate(old, new T)
	// OnDelete is called with the last state the informer had of a
	// deleted object (from the Deleted event when the watch saw it, from
	// the cache when a re-list found it gone).
	OnDelete(obj T)
}

// HandlerFuncs adapts functions to a Handler; nil fields do nothing.
type HandlerFuncs[T store.Object] struct {
	AddFunc    func(obj T)
	UpdateFunc func(old, new T)
	DeleteFunc func(obj T)
}

// OnAdd implements Handler.
func (f HandlerFuncs[T]) OnAdd(obj T) {
	if f.AddFunc != nil {
		f.AddFunc(obj)
	}
}

// OnUpdate implements Handler.
func (f HandlerFuncs[T]) OnUpdate(old, new T) {
	if f.UpdateFunc != nil {
		f.UpdateFunc(old, new)
	}
}

// OnDelete implements Handler.
func (f HandlerFuncs[T]) OnDelete(obj T) {
	if f.DeleteFunc != nil {
		f.DeleteFunc(obj)
	}
}

// Options configures an Informer. The zero value watches every namespace
// and every object, with no logger and the real clock. AssignedPodUID and
// Phase select a subset of Runs (a field selector in Kubernetes): the API
// server sends, and the informer decodes, only their events.
type Options struct {
	// Namespace limits the informer to one namespace; "" means all.
	Namespace string
	// AssignedPodUID limits an informer of Runs to those assigned to
	// this pod (store.ListOptions.AssignedPodUID); "" means all.
	AssignedPodUID string
	// PlacedPodUID limits an informer of Runs to those placed on this
	// pod at their create (store.ListOptions.PlacedPodUID); "" means all.
	PlacedPodUID string
	// Phase limits an informer of Runs to those in this phase
	// (store.WatchOptions.Phase); "" means all. A Run leaving the phase
	// leaves the cache (OnDelete), as one deleted does.
	Phase v1alpha1.Phase
	// Logger receives watch and re-list errors; nil discards them.
	Logger *slog.Logger
	// Clock times the backoff after a failed list or watch; nil means the
	// real clock.
	Clock clock.Clock
}

// Backoff after a failed List or Watch (not after an expired watch, which
// re-lists at once): doubling from minBackoff to maxBackoff.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Informer is a list+watch cache of one kind. Create it with New, register
// handlers, and start it with Run.
type Informer[T store.Object] struct {
	res   store.Resource[T]
	opts  Options
	log   *slog.Logger
	clock clock.Clock

	started  atomic.Bool
	synced   atomic.Bool
	syncedCh chan struct{}

	mu    sync.RWMutex // guards items, rv and advanced
	items map[Key]T
	rv    string // the version the cache reflects
	// advanced is closed and replaced whenever rv moves.
	advanced chan struct{}

	// dispatchMu serialises changes to the cache together with the
	// handler calls for them, and registration (which replays the cache
	// to the new handler), so every handler sees one ordered history.
	dispatchMu sync.Mutex
	handlers   []*registration[T]

	// waits are the Fetches waiting for the cache to reach an object
	// (fetch.go); nwaits counts them, so that applying a change costs
	// nothing more while none waits.
	waitMu sync.Mutex
	waits  map[Key][]*fetchWait
	nwaits atomic.Int32
}

type registration[T store.Object] struct {
	h       Handler[T]
	removed atomic.Bool
}

// New returns an Informer over res; Run starts it.
func New[T store.Object](res store.Resource[T], opts Options) *Informer[T] {
	log := logging.OrDiscard(opts.Logger)
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Informer[T]{
		res:      res,
		opts:     opts,
		log:      log,
		clock:    clk,
		syncedCh: make(chan struct{}),
		items:    map[Key]T{},
		advanced: make(chan struct{}),
	}
}

// AddEventHandler registers h. When the informer already holds objects, h
// first gets OnAdd for each of them, oldest creationTimestamp first, then
// every later change; so registering before or after Run makes no
// difference.
// The returned function unregisters h; after it returns h is not called
// again.
func (i *Informer[T]) AddEventHandler(h Handler[T]) (remove func()) {
	reg := &registration[T]{h: h}
	i.dispatchMu.Lock()
	i.mu.RLock()
	existing := make([]T, 0, len(i.items))
	for _, obj := range i.items {
		existing = append(existing, obj)
	}
	i.mu.RUnlock()
	sortByAge(existing)
	for _, obj := range existing {
		h.OnAdd(obj)
	}
	i.handlers = append(i.handlers, reg)
	i.dispatchMu.Unlock()
	return func() {
		i.dispatchMu.Lock()
		defer i.dispatchMu.Unlock()
		reg.removed.Store(true)
		for n, r := range i.handlers {
			if r == reg {
				i.handlers = append(i.handlers[:n:n], i.handlers[n+1:]...)
				break
			}
		}
	}
}

// HasSynced reports whether the first List has been loaded into the cache
// (and handed to the handlers registered by then).
func (i *Informer[T]) HasSynced() bool { return i.synced.Load() }

// WaitForSync blocks until HasSynced or ctx ends; it returns ctx's error in
// the latter case.
func (i *Informer[T]) WaitForSync(ctx context.Context) error {
	select {
	case <-i.syncedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Synced is closed once HasSynced is true.
func (i *Informer[T]) Synced() <-chan struct{} { return i.syncedCh }

// Get returns the cached object; an empty namespace means
// store.DefaultNamespace. The object is shared: do not mutate it.
func (i *Informer[T]) Get(namespace, name string) (T, bool) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	obj, ok := i.items[Key{Namespace: defaultNamespace(namespace), Name: name}]
	return obj, ok
}

// List returns the cached objects for which filter returns true (all when
// filter is nil), in no particular order. filter runs under the cache's
// read lock: it must be quick and must not call back into the informer.
// The objects are shared: do not mutate them.
func (i *Informer[T]) List(filter func(T) bool) []T {
	i.mu.RLock()
	defer i.mu.RUnlock()
	var out []T
	for _, obj := range i.items {
		if filter == nil || filter(obj) {
			out = append(out, obj)
		}
	}
	return out
}

// ResourceVersion returns the store version the cache reflects: every
// change up to it has been applied and handed to the handlers.
func (i *Informer[T]) ResourceVersion() string {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.rv
}

// setRVLocked moves the cache's version and wakes WaitForResourceVersion;
// i.mu is held.
func (i *Informer[T]) setRVLocked(rv string) {
	i.rv = rv
	close(i.advanced)
	i.advanced = make(chan struct{})
}

// WaitForResourceVersion returns once the cache reflects version rv or a
// later one, or when ctx ends (with its error). Readers of the store use it
// to not get ahead of code that acts on the cache: a client shown a Run at
// rv finds the cache at least there.
//
// "Later" needs an order of versions, which the store contract does not
// promise (Kubernetes calls resourceVersions opaque). So it waits only over
// a store that implements store.VersionOrder — SQLite's, the one store
// standalone mode, its only caller, runs on — and otherwise returns at
// once an error wrapping errdefs.ErrUnimplemented rather than guess. A
// version the store cannot order (not its own) is not waited for.
func (i *Informer[T]) WaitForResourceVersion(ctx context.Context, rv string) error {
	order, ok := i.res.(store.VersionOrder)
	if !ok {
		return fmt.Errorf("informer: wait for resourceVersion %s: the store's versions are opaque: %w", rv, errdefs.ErrUnimplemented)
	}
	if _, err := order.CompareResourceVersions(rv, rv); err != nil {
		return nil
	}
	for {
		i.mu.RLock()
		have := i.rv
		advanced := i.advanced
		i.mu.RUnlock()
		if have != "" {
			if c, err := order.CompareResourceVersions(have, rv); err != nil || c >= 0 {
				return nil
			}
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run lists, then watches and keeps the cache up to date until ctx ends;
// then it returns nil. Failed lists and watches are logged and retried with
// backoff. Run may be called once.
func (i *Informer[T]) Run(ctx context.Context) error {
	if !i.started.CompareAndSwap(false, true) {
		return errors.New("informer: Run called twice")
	}
	backoff := minBackoff
	relist := true
	for ctx.Err() == nil {
		if relist {
			if err := i.list(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				i.log.Warn("informer: list failed", "error", err, "retry_in", backoff)
				i.sleep(ctx, backoff)
				backoff = min(2*backoff, maxBackoff)
				continue
			}
		}
		delivered, err := i.watch(ctx)
		if ctx.Err() != nil {
			break
		}
		switch {
		case err == nil && !delivered:
			// Ended quietly at once: do not spin.
			relist = false
			i.sleep(ctx, backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		case err == nil:
			// The watch ended quietly (the store stopped it); pick up
			// where it left off.
			relist = false
		case errors.Is(err, errdefs.ErrExpired) && delivered:
			// Fell behind: the history after the last event seen may
			// still be kept, which is cheaper than a re-list.
			relist = false
			i.log.Debug("informer: watch expired, watching again from the last version", "error", err)
		case errors.Is(err, errdefs.ErrExpired):
			relist = true
			i.log.Info("informer: history expired, re-listing", "error", err)
		default:
			relist = false
			i.log.Warn("informer: watch failed", "error", err, "retry_in", backoff)
			i.sleep(ctx, backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		if delivered {
			backoff = minBackoff
		}
	}
	return nil
}

func (i *Informer[T]) sleep(ctx context.Context, d time.Duration) {
	t := i.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// list replaces the cache with a fresh List and tells the handlers what
// differs from what they were last told.
func (i *Informer[T]) list(ctx context.Context) error {
	opts := store.ListOptions{Namespace: i.opts.Namespace, AssignedPodUID: i.opts.AssignedPodUID, PlacedPodUID: i.opts.PlacedPodUID}
	if i.opts.Phase != "" {
		opts.Phases = []v1alpha1.Phase{i.opts.Phase}
	}
	items, rv, err := i.res.List(ctx, opts)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	fresh := make(map[Key]T, len(items))
	for _, obj := range items {
		fresh[KeyOf(obj)] = obj
	}

	i.dispatchMu.Lock()
	defer i.dispatchMu.Unlock()
	i.mu.Lock()
	old := i.items
	i.items = fresh
	i.setRVLocked(rv)
	i.mu.Unlock()
	for _, obj := range fresh {
		i.noteApplied(obj, true, false)
	}

	for k, o := range old {
		n, ok := fresh[k]
		switch {
		case !ok:
			i.dispatch(func(h Handler[T]) { h.OnDelete(o) })
		case n.GetUID() != o.GetUID():
			i.dispatch(func(h Handler[T]) { h.OnDelete(o) })
			i.dispatch(func(h Handler[T]) { h.OnAdd(n) })
		case n.GetResourceVersion() != o.GetResourceVersion():
			i.dispatch(func(h Handler[T]) { h.OnUpdate(o, n) })
		}
	}
	var added []T
	for k, n := range fresh {
		if _, ok := old[k]; !ok {
			added = append(added, n)
		}
	}
	sortByAge(added)
	for _, n := range added {
		i.dispatch(func(h Handler[T]) { h.OnAdd(n) })
	}
	if i.synced.CompareAndSwap(false, true) {
		close(i.syncedCh)
	}
	return nil
}

// watch follows the store from the cache's version until the watch ends.
// It reports whether any event was applied, and why the watch ended: nil
// for a quiet end, the Error event's error, or Watch's own error.
func (i *Informer[T]) watch(ctx context.Context) (delivered bool, err error) {
	w, err := i.res.Watch(ctx, store.WatchOptions{ResourceVersion: i.ResourceVersion(), Namespace: i.opts.Namespace,
		AssignedPodUID: i.opts.AssignedPodUID, PlacedPodUID: i.opts.PlacedPodUID, Phase: i.opts.Phase})
	if err != nil {
		return false, fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Type == store.Error {
			return delivered, ev.Err
		}
		i.apply(ev)
		delivered = true
	}
	return delivered, nil
}

// apply puts one watch event into the cache and hands it to the handlers.
func (i *Informer[T]) apply(ev store.Event[T]) {
	obj := ev.Object
	k := KeyOf(obj)
	i.dispatchMu.Lock()
	defer i.dispatchMu.Unlock()
	i.mu.Lock()
	old, had := i.items[k]
	if ev.Type == store.Deleted {
		delete(i.items, k)
	} else {
		i.items[k] = obj
	}
	i.setRVLocked(obj.GetResourceVersion())
	i.mu.Unlock()
	i.noteApplied(obj, false, ev.Type == store.Deleted)

	switch {
	case ev.Type == store.Deleted:
		if had {
			i.dispatch(func(h Handler[T]) { h.OnDelete(obj) })
		}
	case !had:
		i.dispatch(func(h Handler[T]) { h.OnAdd(obj) })
	case old.GetUID() != obj.GetUID():
		// Only possible when a re-watch overlapped a re-create; keep the
		// handlers' view of identity straight.
		i.dispatch(func(h Handler[T]) { h.OnDelete(old) })
		i.dispatch(func(h Handler[T]) { h.OnAdd(obj) })
	case old.GetResourceVersion() != obj.GetResourceVersion():
		i.dispatch(func(h Handler[T]) { h.OnUpdate(old, obj) })
	}
}

// dispatch calls f for every registered handler; the caller holds
// dispatchMu.
func (i *Informer[T]) dispatch(f func(Handler[T])) {
	for _, reg := range i.handlers {
		if !reg.removed.Load() {
			f(reg.h)
		}
	}
}

// sortByAge orders objects oldest creationTimestamp first, then by
// namespace and name, so that handlers that keep FIFO queues get the
// objects they learn about in bulk in a sensible order.
func sortByAge[T store.Object](objs []T) {
	slices.SortFunc(objs, func(a, b T) int {
		if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
			return c
		}
		if c := strings.Compare(a.GetNamespace(), b.GetNamespace()); c != 0 {
			return c
		}
		return strings.Compare(a.GetName(), b.GetName())
	})
}

func defaultNamespace(ns string) string {
	if ns == "" {
		return store.DefaultNamespace
	}
	return ns
}
