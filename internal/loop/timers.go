package loop

import (
	"container/heap"
	"time"
)

// Timers is a time-ordered set of keys to look at again (a retry's
// backoff, a TTL, a grace period): a min-heap on the due time with at most
// one entry per key. It is not safe for concurrent use; the loop that owns
// it pops what is due and sleeps until Next. The zero value is ready.
type Timers[K comparable] struct {
	h   timerHeap[K]
	idx map[K]*timerEntry[K]
	seq uint64 // order of arming, for ties
}

// After arms k for at, unless k is armed for at or earlier already: a key
// is looked at again at the earliest time anyone asked for, and the look
// then arms whatever comes next.
func (t *Timers[K]) After(at time.Time, k K) {
	if e := t.idx[k]; e != nil {
		if e.at.After(at) {
			e.at = at
			heap.Fix(&t.h, e.index)
		}
		return
	}
	t.push(at, k)
}

// Set arms k for exactly at, earlier or later than it was armed for (a
// deadline that moved).
func (t *Timers[K]) Set(at time.Time, k K) {
	if e := t.idx[k]; e != nil {
		e.at = at
		heap.Fix(&t.h, e.index)
		return
	}
	t.push(at, k)
}

// Stop disarms k.
func (t *Timers[K]) Stop(k K) {
	if e := t.idx[k]; e != nil {
		heap.Remove(&t.h, e.index)
		delete(t.idx, k)
	}
}

// At returns when k is due, if it is armed.
func (t *Timers[K]) At(k K) (time.Time, bool) {
	if e := t.idx[k]; e != nil {
		return e.at, true
	}
	return time.Time{}, false
}

func (t *Timers[K]) push(at time.Time, k K) {
	if t.idx == nil {
		t.idx = map[K]*timerEntry[K]{}
	}
	t.seq++
	e := &timerEntry[K]{at: at, key: k, seq: t.seq}
	t.idx[k] = e
	heap.Push(&t.h, e)
}

// Next returns the earliest due time, if any key is armed.
func (t *Timers[K]) Next() (time.Time, bool) {
	if len(t.h) == 0 {
		return time.Time{}, false
	}
	return t.h[0].at, true
}

// PopDue disarms and returns the keys due at or before now, earliest
// first (keys due at the same time in the order they were armed).
func (t *Timers[K]) PopDue(now time.Time) []K {
	var keys []K
	for len(t.h) > 0 && !t.h[0].at.After(now) {
		e := heap.Pop(&t.h).(*timerEntry[K])
		delete(t.idx, e.key)
		keys = append(keys, e.key)
	}
	return keys
}

// Len is the number of armed keys.
func (t *Timers[K]) Len() int { return len(t.h) }

type timerEntry[K comparable] struct {
	at    time.Time
	key   K
	index int
	seq   uint64
}

type timerHeap[K comparable] []*timerEntry[K]

func (h timerHeap[K]) Len() int { return len(h) }
func (h timerHeap[K]) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap[K]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap[K]) Push(x any) {
	e := x.(*timerEntry[K])
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *timerHeap[K]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
