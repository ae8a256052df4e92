package informer

import (
	"container/heap"
	"time"
)

// Timers is a time-ordered set of keys to look at again (a retry's
// backoff, a TTL, a grace period): a min-heap on the due time. It is not
// safe for concurrent use; the component loop that owns it pops what is
// due and sleeps until Next.
type Timers struct{ h timerHeap }

// Push schedules k for at. A key may be pushed more than once; the owner
// re-checks its object when it pops.
func (t *Timers) Push(at time.Time, k Key) { heap.Push(&t.h, timerEntry{at: at, key: k}) }

// Next returns the earliest due time, if any key is scheduled.
func (t *Timers) Next() (time.Time, bool) {
	if len(t.h) == 0 {
		return time.Time{}, false
	}
	return t.h[0].at, true
}

// PopDue removes and returns the keys due at or before now, earliest first.
func (t *Timers) PopDue(now time.Time) []Key {
	var keys []Key
	for len(t.h) > 0 && !t.h[0].at.After(now) {
		keys = append(keys, heap.Pop(&t.h).(timerEntry).key)
	}
	return keys
}

// Len is the number of scheduled keys.
func (t *Timers) Len() int { return len(t.h) }

type timerEntry struct {
	at  time.Time
	key Key
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
