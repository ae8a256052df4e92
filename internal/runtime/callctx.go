package runtime

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context an Instance's Invoke is given: one per
// registration, begun and finished by each invocation in turn (the core
// never runs two at once), so that a warm call makes no context, timer or
// channel of its own (docs/benchmarks.md, "Warm invoke: the pod's CPU per
// call"). The call ends at its deadline, by one timer Reset per call;
// when the caller's context ends, by one context.AfterFunc on it; or when
// the registration drains it. Done's channel is made only when asked for
// and is closed at the call's end, as a per-call context's cancel would,
// so that whatever an adapter derived from the context ends with the
// call. It carries no values: what an adapter needs is in the Invocation.
//
// The context is the call's only until Invoke returns: a stop function
// from AfterFunc or AfterCall must be called before then.
type callCtx struct {
	timer *time.Timer // runs expire; made by the first call, armed per call
	// stopCaller undoes the call's context.AfterFunc on its caller's
	// context; nil when that context can never end.
	stopCaller func() bool

	mu       sync.Mutex
	caller   context.Context // the call's caller; nil between calls
	deadline time.Time
	err      error
	drained  bool          // ended by drain
	done     chan struct{} // nil until asked for in this call
	afters   []afterCall   // AfterFunc's, not yet stopped or run
	seq      uint64        // numbers afters
	first    uint64        // seq of the call's first AfterFunc
}

type afterCall struct {
	f   func()
	seq uint64
}

var _ context.Context = (*callCtx)(nil)

// begin starts a call bounded by timeout and by caller; it returns the
// call's deadline, the caller's if that is sooner.
func (c *callCtx) begin(caller context.Context, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	if d, ok := caller.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.mu.Lock()
	c.caller, c.err, c.drained, c.done = caller, nil, false, nil
	c.deadline = deadline
	c.mu.Unlock()
	if c.timer == nil {
		c.timer = time.AfterFunc(timeout, c.expire)
	} else {
		c.timer.Reset(timeout)
	}
	c.stopCaller = nil
	if caller.Done() != nil {
		c.stopCaller = context.AfterFunc(caller, c.callerEnded)
	}
	return deadline
}

// finish ends the call: its timer and its watch of the caller stop, and
// what was registered on it and not stopped runs, as at the cancel of a
// per-call context.
func (c *callCtx) finish() {
	if c.stopCaller != nil {
		c.stopCaller()
	}
	c.timer.Stop()
	c.mu.Lock()
	if c.err == nil {
		c.endLocked(context.Canceled) // unlocks
		c.mu.Lock()
	}
	c.caller = nil
	c.mu.Unlock()
}

// expire ends the call at its deadline. A run of the timer that an
// earlier call armed and could not stop in time finds a later deadline
// and does nothing.
func (c *callCtx) expire() {
	c.mu.Lock()
	if c.caller == nil || c.err != nil || time.Now().Before(c.deadline) {
		c.mu.Unlock()
		return
	}
	c.endLocked(context.DeadlineExceeded)
}

// callerEnded ends the call when its caller's context has ended. A run
// for an earlier call's caller finds this call's caller live and does
// nothing.
func (c *callCtx) callerEnded() {
	c.mu.Lock()
	if c.caller == nil || c.err != nil || c.caller.Err() == nil {
		c.mu.Unlock()
		return
	}
	c.endLocked(c.caller.Err())
}

// drain ends the call in progress, if any, as UnregisterFunction and
// supersession do (errDrainCancelled).
func (c *callCtx) drain() {
	c.mu.Lock()
	if c.caller == nil || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.drained = true
	c.endLocked(context.Canceled)
}

// endLocked records err, closes Done and runs what was registered with
// AfterFunc; c.mu is held and is unlocked.
func (c *callCtx) endLocked(err error) {
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
	afters := c.afters
	if len(afters) > 0 {
		c.afters = nil // not reused: they run after the unlock
	}
	c.mu.Unlock()
	for _, a := range afters {
		a.f()
	}
}

// closedChan is Done's channel for a call that ended before it was asked.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// ended reports the call's error and whether drain ended it.
func (c *callCtx) ended() (err error, drained bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err, c.drained
}

func (c *callCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *callCtx) Value(any) any { return nil }

// AfterFunc arranges for f to run when the call ends, as
// context.AfterFunc does; context.AfterFunc and context.WithCancel of a
// callCtx come here rather than start a goroutine to watch Done. The
// first one of a call takes no allocation.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	c.seq++
	seq := c.seq
	c.afters = append(c.afters, afterCall{f: f, seq: seq})
	first := len(c.afters) == 1
	if first {
		c.first = seq
	}
	c.mu.Unlock()
	if first {
		return c.stopFirst
	}
	return func() bool { return c.stop(seq) }
}

func (c *callCtx) stopFirst() bool {
	c.mu.Lock()
	seq := c.first
	c.mu.Unlock()
	return c.stop(seq)
}

// stop removes the AfterFunc numbered seq; false if it ran or was
// stopped.
func (c *callCtx) stop(seq uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, a := range c.afters {
		if a.seq == seq {
			c.afters = append(c.afters[:k], c.afters[k+1:]...)
			return true
		}
	}
	return false
}

// AfterCall is context.AfterFunc for an Instance's Invoke: on the call's
// own context it takes no allocation (callCtx.AfterFunc), on any other it
// is context.AfterFunc.
func AfterCall(ctx context.Context, f func()) (stop func() bool) {
	if c, ok := ctx.(*callCtx); ok {
		return c.AfterFunc(f)
	}
	return context.AfterFunc(ctx, f)
}
