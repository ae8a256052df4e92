package dispatch

import (
	"context"
	"sync"
	"time"
)

// Lease is one invocation's hold on one replica, from Acquire until
// Release. Its holder calls the replica once, never again.
type Lease struct {
	d       *Dispatcher
	f       *function
	r       *replica
	replica Replica
	// left: the replica left the Function while the lease was held;
	// call ends the bound call's context then. Both under d.mu.
	left   bool
	call   context.CancelCauseFunc
	waited time.Duration
	once   sync.Once
	// err refuses a waiter (Delete) instead of handing it a replica.
	err error
}

// Replica is the replica leased.
func (l *Lease) Replica() Replica { return l.replica }

// Key is the Function the lease is of.
func (l *Lease) Key() Key { return l.f.key }

// Waited is how long the invocation waited in the queue.
func (l *Lease) Waited() time.Duration { return l.waited }

// Bind returns the context for the invocation's one call to the leased
// replica: ctx, ended with ErrReplicaGone as its cause when the replica
// leaves the Function while the lease is held. Call cancel(nil) when the
// call is over. When the replica has left already, ok is false and nothing was
// bound: the invocation must not be sent to it. One context a call, where
// a context of the lease's own, and a second one following it, cost two
// more and a registration on every invocation.
func (l *Lease) Bind(ctx context.Context) (call context.Context, cancel context.CancelCauseFunc, ok bool) {
	call, cancel = context.WithCancelCause(ctx)
	l.d.mu.Lock()
	ok = !l.left
	if ok {
		l.call = cancel
	}
	l.d.mu.Unlock()
	if !ok {
		cancel(ErrReplicaGone)
		return nil, nil, false
	}
	return call, cancel, true
}

// leftLocked marks the replica gone while the lease is held, and ends
// the bound call. d.mu is held.
func (l *Lease) leftLocked() {
	l.left = true
	if l.call != nil {
		l.call(ErrReplicaGone)
	}
}

// Gone says whether the replica left while the lease was held.
func (l *Lease) Gone() bool {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.left
}

// Release ends the lease: the replica is idle again and goes to the
// oldest waiter. Calling it again does nothing.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.d.mu.Lock()
		defer l.d.mu.Unlock()
		l.call = nil
		l.r.lease = nil
		l.r.backoff = 0
		l.f.inFlight--
		l.d.offer(l.f, l.r)
	})
}

// Busy ends a lease whose replica refused the invocation as busy before
// running it — another gateway holds it (seed 000's one invocation in
// flight is then the arbiter between gateways) — and waits again, first
// in the queue, for another replica, within what is left of the
// invocation's wait. The busy replica is not offered again for a short
// backoff that doubles while it keeps refusing (at most maxHold).
func (l *Lease) Busy(ctx context.Context, timeout time.Duration) (*Lease, error) {
	l.once.Do(func() {
		d, f, r := l.d, l.f, l.r
		d.mu.Lock()
		defer d.mu.Unlock()
		l.call = nil
		r.lease = nil
		f.inFlight--
		r.backoff = min(max(2*r.backoff, minHold), maxHold)
		r.held = true
		// The callback must not read the clock: a fake clock runs it
		// under its own lock.
		d.clock.AfterFunc(r.backoff, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			r.held = false
			d.offer(f, r)
		})
	})
	return l.d.acquire(ctx, l.f.key, timeout, l.waited, true)
}

// Broken ends a lease whose replica could not be reached: its pod
// stopped answering, or is gone before its Run says so. The replica takes
// nothing until its Run changes (a new Version through Sync) or
// BrokenHold has passed (a worker being replaced answers again).
func (l *Lease) Broken() {
	l.once.Do(func() {
		d, f, r := l.d, l.f, l.r
		d.mu.Lock()
		defer d.mu.Unlock()
		l.call = nil
		r.lease = nil
		r.broken = true
		f.inFlight--
		d.clock.AfterFunc(BrokenHold, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			r.broken = false
			d.offer(f, r)
		})
	})
}

// BrokenHold is how long a replica found broken is left out when its
// Run does not change.
const BrokenHold = time.Second

// Requeue waits again, first in the queue, for a replica, within what
// is left of the invocation's wait: for an invocation whose lease ended
// Broken before it was sent.
func (l *Lease) Requeue(ctx context.Context, timeout time.Duration) (*Lease, error) {
	return l.d.acquire(ctx, l.f.key, timeout, l.waited, true)
}

// How long a replica another gateway holds is left alone.
const (
	minHold = 2 * time.Millisecond
	maxHold = 100 * time.Millisecond
)
