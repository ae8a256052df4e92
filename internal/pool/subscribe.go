package pool

import "sync"

// queueWarn is the queue length at which a subscriber that does not keep up
// is logged (once).
const queueWarn = 1024

// Subscribe returns a channel of pod transitions, the pods that are ready
// at this moment, and a cancel func. Snapshot and channel are taken
// atomically: every transition after the snapshot comes on the channel, and
// none before it. Events of one pod come in order.
//
// Delivery never blocks the supervisor and never drops an event silently:
// each subscriber has its own queue, unbounded but compacted, which is
// enough because the pods are few:
//   - a PodReady not yet received is replaced by a newer PodReady of the
//     same pod (a Slots change), keeping its place;
//   - a PodReady not yet received is dropped when the PodGone of the same
//     pod is queued: the subscriber then gets a PodGone for a pod it never
//     saw ready, which it must accept (a Run may still name that pod).
//
// So a subscriber that stops reading costs one small Event per pod that
// dies meanwhile; past 1024 queued events the supervisor logs a warning.
//
// Call cancel when done: it ends the delivery goroutine and closes the
// channel; it is safe to call more than once. After Run has returned the
// channel is closed once the subscriber has received every queued event (a
// Subscribe after that gets a closed channel and no pods).
func (s *Supervisor) Subscribe() (events <-chan Event, snapshot []Pod, cancel func()) {
	sub := &subscription{
		s:         s,
		ch:        make(chan Event),
		wake:      make(chan struct{}, 1),
		cancelled: make(chan struct{}),
		done:      make(chan struct{}),
	}
	s.mu.Lock()
	snapshot = s.readyLocked()
	if s.ended {
		sub.final = true
	} else {
		s.subs[sub] = struct{}{}
	}
	s.mu.Unlock()
	go sub.pump()
	return sub.ch, snapshot, sub.cancel
}

// subscription is one subscriber's queue and the goroutine that feeds its
// channel from it.
type subscription struct {
	s  *Supervisor
	ch chan Event

	// Guarded by s.mu. queue[i] has sequence number head+i; an entry with
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

// enqueueLocked queues ev, compacting as Subscribe describes. s.mu is held.
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
		sub.s.log.Warn("a pool subscriber is not reading its events", "queued", n)
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

// popLocked takes the next event to deliver, if any. s.mu is held.
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
	mu := &sub.s.mu
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
		sub.s.mu.Lock()
		delete(sub.s.subs, sub)
		sub.queue, sub.readyAt, sub.dropped = nil, nil, 0
		sub.s.mu.Unlock()
		close(sub.cancelled)
	})
	<-sub.done
}

// endSubscriptions marks every subscription final: its channel closes once
// its queue is drained.
func (s *Supervisor) endSubscriptions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	clear(s.ready)
	for sub := range s.subs {
		sub.final = true
		sub.signal()
	}
	clear(s.subs)
}
