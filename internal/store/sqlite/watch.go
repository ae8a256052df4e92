package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// replayPage is how many log rows one replay query reads. Rows are read
// into memory before any is sent, so a slow receiver never holds a read
// transaction open (which would stop WAL checkpoints).
const replayPage = 256

// outBuffer is the capacity of a watcher's channel: enough to hand events
// over in bursts instead of one goroutine switch per event.
const outBuffer = 64

// liveEvent is a committed change handed to a watcher by the writer. obj is
// shared by all watchers and never mutated; each receiver gets a copy.
type liveEvent[T store.Object] struct {
	typ store.EventType
	obj T
}

// watcher is one watch. Its goroutine (run) first replays the log over
// (from, until], then delivers the live events that writers queued since
// registration, all of which are newer than until. Writers never block on
// it: they append to queue, and when the queue is full the watch fails.
type watcher[T store.Object] struct {
	r           *resource[T]
	ctx         context.Context
	namespace   string
	podUID      string         // WatchOptions.AssignedPodUID
	placedUID   string         // WatchOptions.PlacedPodUID
	phase       v1alpha1.Phase // WatchOptions.Phase
	from, until int64
	limit       int

	out      chan store.Event[T]
	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
	wake     chan struct{} // capacity 1: "the queue changed"

	mu     sync.Mutex
	queue  []liveEvent[T]
	failed error // the queue overflowed, or the store lost an event
}

// Watch implements store.Resource.
func (r *resource[T]) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher[T], error) {
	fromNow := opts.ResourceVersion == "" || opts.ResourceVersion == "0"
	var from int64
	if !fromNow {
		v, err := strconv.ParseInt(opts.ResourceVersion, 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("watch %ss: resourceVersion %q is not a version: %w", r.k.noun, opts.ResourceVersion, errdefs.ErrInvalidArgument)
		}
		from = v
	}
	if opts.AssignedPodUID != "" && r.k.assignedPodUID == nil {
		return nil, fmt.Errorf("watch %ss: an assigned pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if opts.PlacedPodUID != "" && r.k.placedPodUID == nil {
		return nil, fmt.Errorf("watch %ss: a placed pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if opts.Phase != "" && !r.k.hasPhase {
		return nil, fmt.Errorf("watch %ss: a phase filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errClosed()
	}
	if fromNow {
		from = c.rv
	}
	if from > c.rv {
		// Only a version from another database (the data directory was
		// replaced) can be ahead; re-listing is the way out of that too.
		return nil, fmt.Errorf("watch %ss: resourceVersion %d is newer than the store's %d: %w, re-list", r.k.noun, from, c.rv, errdefs.ErrExpired)
	}
	if from < c.oldest-1 {
		return nil, fmt.Errorf("watch %ss from resourceVersion %d: the oldest change kept is %d: %w, re-list", r.k.noun, from, c.oldest, errdefs.ErrExpired)
	}
	w := &watcher[T]{
		r:         r,
		ctx:       ctx,
		namespace: opts.Namespace,
		podUID:    opts.AssignedPodUID,
		placedUID: opts.PlacedPodUID,
		phase:     opts.Phase,
		from:      from,
		until:     c.rv,
		limit:     c.opts.watchBuffer,
		out:       make(chan store.Event[T], outBuffer),
		stop:      make(chan struct{}),
		exited:    make(chan struct{}),
		wake:      make(chan struct{}, 1),
	}
	r.watchers[w] = struct{}{}
	c.wg.Add(1)
	go w.run()
	return w, nil
}

// Events implements store.Watcher.
func (w *watcher[T]) Events() <-chan store.Event[T] { return w.out }

// Stop implements store.Watcher.
func (w *watcher[T]) Stop() {
	w.end()
	<-w.exited
}

func (w *watcher[T]) end() { w.stopOnce.Do(func() { close(w.stop) }) }

// fanout hands a committed change to every live watcher of the kind. The
// caller holds c.mu, so watchers receive changes in commit order. A watcher
// whose queue is full is failed and dropped here instead of being waited
// for.
func (r *resource[T]) fanout(typ store.EventType, prev, obj T) {
	for w := range r.watchers {
		if w.namespace != "" && w.namespace != obj.GetNamespace() {
			continue
		}
		seen, out := typ, obj
		if w.filtered() {
			var ok bool
			if seen, ok = w.filter(typ, typ != store.Added && w.matches(prev), obj); !ok {
				continue
			}
			if seen == store.Deleted && typ == store.Modified {
				out = leftAt(prev, obj.GetResourceVersion())
			}
		}
		if !w.push(liveEvent[T]{typ: seen, obj: out}) {
			delete(r.watchers, w)
		}
	}
}

// filtered says whether the watch sees a set of objects (by assigned pod,
// by phase) rather than every one.
func (w *watcher[T]) filtered() bool { return w.podUID != "" || w.placedUID != "" || w.phase != "" }

// matches reports whether obj is in a filtered watch's set.
func (w *watcher[T]) matches(obj T) bool {
	return (w.podUID == "" || w.r.k.assignedPodUID(obj) == w.podUID) &&
		(w.placedUID == "" || w.r.k.placedPodUID(obj) == w.placedUID) &&
		(w.phase == "" || w.r.k.phase(obj) == string(w.phase))
}

// leftAt is what a filtered watch's Deleted event carries for an object
// that a write took out of its set: the last state in the set, at the
// version of that write (what a Kubernetes watch with a field selector
// delivers).
func leftAt[T store.Object](last T, rv string) T {
	out := last.DeepCopyObject().(T)
	out.SetResourceVersion(rv)
	return out
}

// filter is what a filtered watch sees of a change, given
// whether the object was in its set before: as with a Kubernetes field
// selector, entering the set is Added, leaving it Deleted. ok is false when
// the change is outside the set before and after.
func (w *watcher[T]) filter(typ store.EventType, before bool, obj T) (seen store.EventType, ok bool) {
	after := typ != store.Deleted && w.matches(obj)
	if typ == store.Deleted {
		before = w.matches(obj) // the last state is the state before
	}
	switch {
	case before && after:
		return store.Modified, true
	case after:
		return store.Added, true
	case before:
		return store.Deleted, true
	}
	return "", false
}

// push queues ev, or fails the watch when its consumer is too far behind.
// It reports whether the watcher is still live.
func (w *watcher[T]) push(ev liveEvent[T]) bool {
	w.mu.Lock()
	live := w.failed == nil
	if live && len(w.queue) >= w.limit {
		w.queue = nil
		w.failed = fmt.Errorf("watch %ss: the receiver fell more than %d events behind: %w, re-list", w.r.k.noun, w.limit, errdefs.ErrExpired)
		live = false
	}
	if live {
		w.queue = append(w.queue, ev)
	}
	w.mu.Unlock()
	w.signal()
	return live
}

func (w *watcher[T]) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// fail ends the watch with err after what it already delivered; the caller
// holds c.mu.
func (w *watcher[T]) fail(err error) {
	w.mu.Lock()
	if w.failed == nil {
		w.queue = nil
		w.failed = err
	}
	w.mu.Unlock()
	w.signal()
}

// endWatchers implements watchSet.
func (r *resource[T]) endWatchers() {
	for w := range r.watchers {
		w.end()
		delete(r.watchers, w)
	}
}

// expireWatchers implements watchSet.
func (r *resource[T]) expireWatchers(err error) {
	for w := range r.watchers {
		w.fail(err)
		delete(r.watchers, w)
	}
}

// run is the watcher's goroutine: replay, then live events, until the
// watch ends.
func (w *watcher[T]) run() {
	defer func() {
		w.r.c.mu.Lock()
		delete(w.r.watchers, w)
		w.r.c.mu.Unlock()
		close(w.out)
		close(w.exited)
		w.r.c.wg.Done()
	}()
	if !w.replay() {
		return
	}
	for {
		w.mu.Lock()
		batch, failed := w.queue, w.failed
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range batch {
			if !w.send(store.Event[T]{Type: ev.typ, Object: ev.obj.DeepCopyObject().(T)}) {
				return
			}
		}
		if failed != nil {
			w.send(store.Event[T]{Type: store.Error, Err: failed})
			return
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-w.wake:
		case <-w.stop:
			return
		case <-w.ctx.Done():
			return
		}
	}
}

// send delivers ev unless the watch ends first.
func (w *watcher[T]) send(ev store.Event[T]) bool {
	select {
	case w.out <- ev:
		return true
	case <-w.stop:
		return false
	case <-w.ctx.Done():
		return false
	}
}

// logRow is one row of the events table.
type logRow struct {
	rv        int64
	kind      string
	typ       string
	namespace string
	body      []byte
}

// replay delivers the logged changes in (from, until]. Every commit has
// one row, so versions in the log are consecutive: a missing version means
// the log was pruned under the watch, which ends it as expired. It reports
// whether the watch goes on.
func (w *watcher[T]) replay() bool {
	last := w.from
	// inSet remembers, for a filtered watch, the state of each object it
	// met in the replay while in its set (nil when out of it).
	inSet := map[objectKey]T{}
	for last < w.until {
		page, err := w.readPage(last)
		if err != nil {
			if w.ctx.Err() == nil {
				w.send(store.Event[T]{Type: store.Error, Err: fmt.Errorf("watch %ss: replay from %d: %w", w.r.k.noun, last, err)})
			}
			return false
		}
		if len(page) == 0 {
			page = []logRow{{rv: -1}} // fall into the gap check below
		}
		for _, row := range page {
			if row.rv != last+1 {
				w.send(store.Event[T]{Type: store.Error, Err: fmt.Errorf("watch %ss: the changes after resourceVersion %d were pruned during the replay: %w, re-list", w.r.k.noun, last, errdefs.ErrExpired)})
				return false
			}
			last = row.rv
			if row.kind != w.r.k.name || (w.namespace != "" && w.namespace != row.namespace) {
				continue
			}
			obj, err := w.r.decode(row.body, row.rv)
			if err != nil {
				w.send(store.Event[T]{Type: store.Error, Err: fmt.Errorf("watch %ss: %w", w.r.k.noun, err)})
				return false
			}
			typ := store.EventType(row.typ)
			if w.filtered() {
				key := objectKey{row.namespace, obj.GetName()}
				prev, known := inSet[key]
				if !known && typ == store.Modified {
					if prev, err = w.stateBefore(key, row.rv); err != nil {
						w.send(store.Event[T]{Type: store.Error, Err: err})
						return false
					}
				}
				var zero T
				inSet[key] = zero
				if typ != store.Deleted && w.matches(obj) {
					inSet[key] = obj
				}
				seen, ok := w.filter(typ, prev != nil && typ != store.Added, obj)
				if !ok {
					continue
				}
				if seen == store.Deleted && typ == store.Modified {
					obj = leftAt(prev, obj.GetResourceVersion())
				}
				typ = seen
			}
			if !w.send(store.Event[T]{Type: typ, Object: obj}) {
				return false
			}
		}
	}
	return true
}

// readPage reads up to replayPage log rows after last, up to until.
func (w *watcher[T]) readPage(last int64) ([]logRow, error) {
	rows, err := w.r.c.replayEvents.QueryContext(w.ctx, last, w.until, replayPage)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var page []logRow
	for rows.Next() {
		var row logRow
		if err := rows.Scan(&row.rv, &row.kind, &row.typ, &row.namespace, &row.body); err != nil {
			return nil, err
		}
		page = append(page, row)
	}
	return page, rows.Err()
}

// stateBefore returns an object's state just before the change at rv if
// it was in a filtered watch's set then, nil if not, from its previous
// change in the log. When the log no longer holds one, the state the watch
// starts from is unknown: the watch ends as expired and the watcher
// re-lists.
func (w *watcher[T]) stateBefore(key objectKey, rv int64) (T, error) {
	var (
		zero T
		typ  string
		prv  int64
		body []byte
	)
	err := w.r.c.r.QueryRowContext(w.ctx, `SELECT rv, type, body FROM events WHERE kind = ? AND namespace = ? AND name = ? AND rv < ? ORDER BY rv DESC LIMIT 1`,
		w.r.k.name, key.namespace, key.name, rv).Scan(&prv, &typ, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return zero, fmt.Errorf("watch %ss: the change before %s %s/%s at resourceVersion %d was pruned: %w, re-list", w.r.k.noun, w.r.k.noun, key.namespace, key.name, rv, errdefs.ErrExpired)
	}
	if err != nil {
		return zero, fmt.Errorf("watch %ss: read the change before resourceVersion %d: %w", w.r.k.noun, rv, err)
	}
	if store.EventType(typ) == store.Deleted {
		return zero, nil
	}
	prev, err := w.r.decode(body, prv)
	if err != nil {
		return zero, fmt.Errorf("watch %ss: %w", w.r.k.noun, err)
	}
	if !w.matches(prev) {
		return zero, nil
	}
	return prev, nil
}
