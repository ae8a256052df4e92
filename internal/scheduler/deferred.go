package scheduler

import (
	"sync"
	"time"

	"stoke.dev/stoke/internal/informer"
)

// deferBound bounds how long Defer holds a Run back, should its release
// never come (it always does: the caller releases once its creates have
// returned, or failed).
const deferBound = 10 * time.Second

// deferrals are the Runs Defer holds back, with when each hold lapses.
type deferrals struct {
	mu    sync.Mutex
	until map[informer.Key]time.Time
}

// Defer holds back the placement of the Runs at keys, which the caller is
// about to create together (a workflow decision's step Runs: a fan-out's
// dependants), until release is called, or deferBound has passed: the
// scheduler does not queue them, so no assignment of the first ones, nor
// what follows it (runtimed's claim, the process, its end, each a write),
// competes with the creates of the rest for the store and the machine.
// Once released they are decided at once, as if just created. Nothing is
// written for a deferral and nothing of it is stored: it lives in this
// process, as the caller does, and the scheduler remains the one writer
// of placements. It never blocks and may be called from any goroutine;
// release may be called more than once.
func (s *Scheduler) Defer(keys []informer.Key) (release func()) {
	until := s.clk.Now().Add(deferBound)
	d := &s.deferrals
	d.mu.Lock()
	if d.until == nil {
		d.until = map[informer.Key]time.Time{}
	}
	for _, k := range keys {
		d.until[k] = until
	}
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			for _, k := range keys {
				if d.until[k].Equal(until) {
					delete(d.until, k)
				}
			}
			d.mu.Unlock()
			for _, k := range keys {
				s.loop.Add(loopKey{keyRun, k})
			}
		})
	}
}

// deferred reports whether the Run at k is held back by Defer at now, and
// until when; a lapsed hold is forgotten.
func (s *Scheduler) deferred(k informer.Key, now time.Time) (time.Time, bool) {
	d := &s.deferrals
	d.mu.Lock()
	defer d.mu.Unlock()
	until, ok := d.until[k]
	if ok && !now.Before(until) {
		delete(d.until, k)
		return time.Time{}, false
	}
	return until, ok
}
