package podsource

import (
	"log/slog"
	"sort"
	"sync"

	"stoke.dev/stoke/internal/logging"
)

// queueWarn is the queue length at which a subscriber that does not keep up
// is logged (once).
const queueWarn = 1024

// Hub is the publishing half of a Source: a pod source calls Publish for
// each transition and End when it stops; the hub keeps the set of ready
// pods and a queue per subscriber. Its methods may be called from any
// goroutine.
type Hub struct {
	log *slog.Logger

	mu    sync.Mutex
	ready map[string]Pod // by UID: the pods announced ready and not yet gone
	subs  map[*subscription]struct{}
	ended bool // End was called: no more events
}

// NewHub returns a hub with no pods; log (nil discards) gets the warning
// about a subscriber that does not read.
func NewHub(log *slog.Logger) *Hub {
	return &Hub{
		log:   logging.OrDiscard(log),
		ready: make(map[string]Pod),
		subs:  make(map[*subscription]struct{}),
	}
}

// Pods returns the pods announced ready and not yet gone, sorted by name.
func (h *Hub) Pods() []Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.readyLocked()
}

// Lookup returns the pod with this UID if it was announced ready and is
// not yet gone.
func (h *Hub) Lookup(uid string) (Pod, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.ready[uid]
	return p, ok
}

func (h *Hub) readyLocked() []Pod {
	pods := make([]Pod, 0, len(h.ready))
	for _, p := range h.ready {
		pods = append(pods, p)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods
}

// Publish records ev in the ready set and queues it for every subscriber,
// in one step, so a Subscribe sees either the state before ev and then ev,
// or the state after it. It never blocks on a subscriber. Events after End
// are ignored.
func (h *Hub) Publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	switch ev.Type {
	case PodReady:
		h.ready[ev.Pod.UID] = ev.Pod
	case PodGone:
		delete(h.ready, ev.Pod.UID)
	}
	for sub := range h.subs {
		sub.enqueueLocked(ev)
	}
}

// End marks every subscription final: its channel closes once its queue is
// drained. A source calls it when it stops, after its last PodGone.
func (h *Hub) End() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	clear(h.ready)
	for sub := range h.subs {
		sub.final = true
		sub.signal()
	}
	clear(h.subs)
}

// Subscribe returns a channel of pod transitions, the pods that are ready
// at this moment, and a cancel func. Snapshot and channel are taken
// atomically: every transition after the snapshot comes on the channel, and
// none before it. Events of one pod come in order.
//
// Delivery never blocks the publisher and never drops an event silently:
// each subscriber has its own queue, unbounded but compacted, which is
// enough because the pods are few:
//   - a PodReady not yet received is replaced by a newer PodReady of the
//     same pod (a Slots change), keeping its place;
//   - a PodReady not yet received is dropped when the PodGone of the same
//     pod is queued: the subscriber then gets a PodGone for a pod it never
//     saw ready, which it must accept (a Run may still name that pod).
//
// So a subscriber that stops reading costs one small Event per pod that
// dies meanwhile; past 1024 queued events the hub logs a warning.
//
// Call cancel when done: it ends the delivery goroutine and closes the
// channel; it is safe to call more than once. After End the channel is
// closed once the subscriber has received every queued event (a Subscribe
// after that gets a closed channel and no pods).
func (h *Hub) Subscribe() (events <-chan Event, snapshot []Pod, cancel func()) {
	sub := &subscription{
		h:         h,
		ch:        make(chan Event),
		wake:      make(chan struct{}, 1),
		cancelled: make(chan struct{}),
		done:      make(chan struct{}),
	}
	h.mu.Lock()
	snapshot = h.readyLocked()
	if h.ended {
		sub.final = true
	} else {
		h.subs[sub] = struct{}{}
	}
	h.mu.Unlock()
	go sub.pump()
	return sub.ch, snapshot, sub.cancel
}

// subscription is one subscriber's queue and the goroutine that feeds its
// channel from it.
type subscription struct {
	h  *Hub
	ch chan Event

	// Guarded by h.mu. queue[i] has sequence number head+i; an entry with
	// an empty Type is a dropped PodReady, skipped on delivery. readyAt
	// maps a pod UID to the sequence number of its queued PodReady, so
	// that compaction costs O(1) per event.
	queue   []Event
	head    int64
	readyAt map[string]int64
	dropped int
	final   bool // nothing more will be queued
	warned  bool

	wake       chan struct{} // cap 1: the queue changed
	cancelled  chan struct{}
	cancelOnce sync.Once
	done       chan struct{} // pump has returned and closed ch
}

// enqueueLocked queues ev, compacting as Subscribe describes. h.mu is held.
func (sub *subscription) enqueueLocked(ev Event) {
	if sub.readyAt == nil {
		sub.readyAt = make(map[string]int64)
	}
	uid := ev.Pod.UID
	seq, queued := sub.readyAt[uid]
	switch ev.Type {
	case PodReady:
		if queued {
			sub.queue[seq-sub.head] = ev
			return
		}
		sub.readyAt[uid] = sub.head + int64(len(sub.queue))
	case PodGone:
		if queued {
			sub.queue[seq-sub.head] = Event{}
			delete(sub.readyAt, uid)
			sub.dropped++
		}
	}
	sub.queue = append(sub.queue, ev)
	if sub.dropped > 64 && sub.dropped > len(sub.queue)/2 {
		sub.compactLocked()
	}
	if n := len(sub.queue) - sub.dropped; n >= queueWarn && !sub.warned {
		sub.warned = true
		sub.h.log.Warn("a pod subscriber is not reading its events", "queued", n)
	}
	sub.signal()
}

// compactLocked removes the dropped entries from the queue.
func (sub *subscription) compactLocked() {
	kept := make([]Event, 0, len(sub.queue)-sub.dropped)
	for _, ev := range sub.queue {
		if ev.Type != "" {
			if ev.Type == PodReady {
				sub.readyAt[ev.Pod.UID] = sub.head + int64(len(kept))
			}
			kept = append(kept, ev)
		}
	}
	sub.queue = kept
	sub.dropped = 0
}

// popLocked takes the next event to deliver, if any. h.mu is held.
func (sub *subscription) popLocked() (Event, bool) {
	for len(sub.queue) > 0 {
		ev := sub.queue[0]
		sub.queue[0] = Event{}
		sub.queue = sub.queue[1:]
		sub.head++
		if ev.Type == "" {
			sub.dropped--
			continue
		}
		if ev.Type == PodReady && sub.readyAt[ev.Pod.UID] == sub.head-1 {
			delete(sub.readyAt, ev.Pod.UID)
		}
		return ev, true
	}
	sub.queue = nil // let a long queue's array go
	return Event{}, false
}

func (sub *subscription) signal() {
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// pump moves events from the queue to the channel until cancel, or until
// the queue is empty and final.
func (sub *subscription) pump() {
	defer close(sub.done)
	defer close(sub.ch)
	mu := &sub.h.mu
	for {
		mu.Lock()
		ev, ok := sub.popLocked()
		final := sub.final
		mu.Unlock()
		if !ok {
			if final {
				return
			}
			select {
			case <-sub.wake:
				continue
			case <-sub.cancelled:
				return
			}
		}
		select {
		case sub.ch <- ev:
		case <-sub.cancelled:
			return
		}
	}
}

func (sub *subscription) cancel() {
	sub.cancelOnce.Do(func() {
		sub.h.mu.Lock()
		delete(sub.h.subs, sub)
		sub.queue, sub.readyAt, sub.dropped = nil, nil, 0
		sub.h.mu.Unlock()
		close(sub.cancelled)
	})
	<-sub.done
}
