// Package dispatch gives each invocation of a Function one idle replica,
// or a place in the Function's bounded FIFO queue until one is idle. It
// keeps seed 000's contract above it: a replica is one registration, and
// it never has two invocations in flight, because the dispatcher leases a
// replica to one invocation at a time. It knows no store and no
// transport: its caller tells it which replicas each Function has (Sync)
// and calls the leased replica itself, once, never again after dispatch.
package dispatch

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Key names a Function.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Replica is one registration a Function's invocations may go to.
type Replica struct {
	// ID is the replica Run's UID: the registration's identity.
	ID string
	// Name is the replica Run's name, for messages.
	Name string
	// Takes says the replica may be given new invocations: its Run is
	// Ready and not draining. A replica that does not take keeps the
	// invocation it has in flight.
	Takes bool
	// Version changes whenever the replica's Run does (its
	// resourceVersion): a replica found broken takes invocations again
	// once its Version changes.
	Version string
}

// Settings bound a Function's queue; zero fields take the defaults of
// internal/bounds.
type Settings struct {
	// QueueLength is how many invocations may wait for an idle replica.
	QueueLength int
	// QueueWait is how long one may wait.
	QueueWait time.Duration
}

func (s Settings) withDefaults() Settings {
	if s.QueueLength <= 0 {
		s.QueueLength = bounds.FunctionQueue
	}
	if s.QueueWait <= 0 {
		s.QueueWait = bounds.FunctionQueueWait
	}
	return s
}

// Load is what a Function's invocations hold now.
type Load struct {
	// InFlight counts the invocations dispatched and not yet ended.
	InFlight int
	// Queued counts the invocations waiting for an idle replica.
	Queued int
	// Replicas counts the replicas known, Taking those that take new
	// invocations (not draining, not found broken).
	Replicas, Taking int
}

// LoadReader is the dispatcher as the Function status writer and the
// autoscaler read it.
type LoadReader interface {
	// Load is the Function's load now (zero for a Function never seen).
	Load(Key) Load
	// Loads is every Function's load now.
	Loads() map[Key]Load
}

// ErrReplicaGone is the cause with which a lease's context ends when its
// replica leaves the Function (its Run or its pod is gone).
var ErrReplicaGone = errors.New("the replica left the function")

// QueueRetry is the Retry-After of an invocation refused by a full queue
// or a wait that ran out.
const QueueRetry = time.Second

// Config configures a Dispatcher.
type Config struct {
	// Clock times the queue's waits (tests use a fake one); nil is the
	// real clock.
	Clock clock.WithDelayedExecution
	// OnQueue, when set, is called with a Function's key each time an
	// invocation starts waiting in its queue (no replica was idle): the
	// autoscaler's Poke, so that an idle Function scales from zero at
	// once. It is called outside the dispatcher's lock and must not
	// block.
	OnQueue func(Key)
}

// Dispatcher leases replicas to invocations, per Function.
type Dispatcher struct {
	clock   clock.WithDelayedExecution
	onQueue func(Key)

	mu  sync.Mutex
	fns map[Key]*function
}

var _ LoadReader = (*Dispatcher)(nil)

// function is one Function's replicas and queue, under Dispatcher.mu.
type function struct {
	key      Key
	settings Settings
	replicas map[string]*replica
	// idle is a stack of replicas that may be idle: the most recently
	// used is given first, so that under light load the others stay idle
	// and can be scaled down. Entries are checked when popped.
	idle     []*replica
	queue    list.List // of *waiter, oldest first
	inFlight int
}

type replica struct {
	Replica
	lease  *Lease // the invocation in flight, or nil
	gone   bool
	inIdle bool
	// held: another gateway holds it (it answered busy); it is not
	// idle until its backoff has passed.
	held    bool
	backoff time.Duration
	// broken: its pod stopped answering (Lease.Broken); it takes nothing
	// until its Run changes.
	broken bool
}

// waiter is one queued invocation.
type waiter struct {
	ready chan *Lease // buffered 1: a handoff never blocks
	elem  *list.Element
}

// New returns a Dispatcher.
func New(cfg Config) *Dispatcher {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Dispatcher{clock: cfg.Clock, onQueue: cfg.OnQueue, fns: map[Key]*function{}}
}

func (d *Dispatcher) fn(key Key) *function {
	f := d.fns[key]
	if f == nil {
		f = &function{key: key, settings: Settings{}.withDefaults(), replicas: map[string]*replica{}}
		d.fns[key] = f
	}
	return f
}

// Sync sets a Function's queue settings and replicas. A replica not in
// the list leaves: the invocation it has in flight ends with
// ErrReplicaGone as the cause of the context its lease bound (Lease.Bind). A replica that newly
// takes invocations goes to the oldest waiter first.
func (d *Dispatcher) Sync(key Key, settings Settings, replicas []Replica) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fn(key)
	f.settings = settings.withDefaults()
	seen := make(map[string]bool, len(replicas))
	for _, in := range replicas {
		seen[in.ID] = true
		r := f.replicas[in.ID]
		if r == nil {
			r = &replica{Replica: in}
			f.replicas[in.ID] = r
		}
		if r.Version != in.Version {
			r.broken = false
		}
		r.Replica = in
		d.offer(f, r)
	}
	for id, r := range f.replicas {
		if seen[id] {
			continue
		}
		delete(f.replicas, id)
		r.gone = true
		if r.lease != nil {
			r.lease.leftLocked()
		}
	}
	// Waiters beyond a shortened queue keep their places: the bound
	// applies to new arrivals.
}

// Delete forgets a Function: its waiters are refused with err (its
// category decides their answer). Invocations in flight go on; their
// replicas leave through Sync as their Runs go.
func (d *Dispatcher) Delete(key Key, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fns[key]
	if f == nil {
		return
	}
	delete(d.fns, key)
	for e := f.queue.Front(); e != nil; e = f.queue.Front() {
		w := f.queue.Remove(e).(*waiter)
		w.elem = nil
		w.ready <- &Lease{err: err}
	}
}

// offer gives r, if it is idle, to the oldest waiter, or marks it idle.
func (d *Dispatcher) offer(f *function, r *replica) {
	if r.gone || !r.Takes || r.lease != nil || r.inIdle || r.held || r.broken {
		return
	}
	if e := f.queue.Front(); e != nil {
		w := f.queue.Remove(e).(*waiter)
		w.elem = nil
		w.ready <- d.lease(f, r)
		return
	}
	r.inIdle = true
	f.idle = append(f.idle, r)
}

// popIdle takes the most recently idle replica that is still idle.
func (d *Dispatcher) popIdle(f *function) *replica {
	for len(f.idle) > 0 {
		r := f.idle[len(f.idle)-1]
		f.idle[len(f.idle)-1] = nil
		f.idle = f.idle[:len(f.idle)-1]
		r.inIdle = false
		if !r.gone && r.Takes && !r.broken && r.lease == nil {
			return r
		}
	}
	return nil
}

// lease marks r in flight for a new invocation.
func (d *Dispatcher) lease(f *function, r *replica) *Lease {
	l := &Lease{d: d, f: f, r: r, replica: r.Replica}
	r.lease = l
	f.inFlight++
	return l
}

// Acquire leases an idle replica of the Function to one invocation whose
// own timeout is timeout (0: the server's default). When none is idle
// the invocation waits in the Function's FIFO queue, at most the queue's
// wait bound and never past its own timeout, which the wait counts
// against. A full queue, or a wait that ran out, is ResourceExhausted
// with a Retry-After; the invocation was not dispatched. When ctx ends
// first, its error is returned.
func (d *Dispatcher) Acquire(ctx context.Context, key Key, timeout time.Duration) (*Lease, error) {
	return d.acquire(ctx, key, timeout, 0, false)
}

func (d *Dispatcher) acquire(ctx context.Context, key Key, timeout, waited time.Duration, front bool) (*Lease, error) {
	start := d.clock.Now()
	d.mu.Lock()
	f := d.fn(key)
	if f.queue.Len() == 0 || front {
		if r := d.popIdle(f); r != nil {
			l := d.lease(f, r)
			d.mu.Unlock()
			l.waited = waited
			return l, nil
		}
	}
	if !front && f.queue.Len() >= f.settings.QueueLength {
		n := f.queue.Len()
		d.mu.Unlock()
		return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
			"function %s: %d invocations are waiting for a replica, the most its queue holds; retry later", key, n), QueueRetry)
	}
	w := &waiter{ready: make(chan *Lease, 1)}
	if front {
		w.elem = f.queue.PushFront(w)
	} else {
		w.elem = f.queue.PushBack(w)
	}
	wait := f.settings.QueueWait - waited
	if timeout <= 0 {
		timeout = bounds.DefaultInvokeTimeout
	}
	wait = min(wait, timeout-waited)
	d.mu.Unlock()
	if d.onQueue != nil && !front {
		d.onQueue(key)
	}

	timer := d.clock.NewTimer(max(wait, 0))
	defer timer.Stop()
	var cause error
	select {
	case l := <-w.ready:
		return d.handed(l, waited+d.clock.Since(start))
	case <-timer.C():
		cause = errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
			"function %s: no replica was free within %v of waiting; the invocation was not run, retry later",
			key, (waited+d.clock.Since(start)).Round(time.Millisecond)), QueueRetry)
	case <-ctx.Done():
		cause = ctx.Err()
	}
	d.mu.Lock()
	if w.elem != nil {
		f.queue.Remove(w.elem)
		w.elem = nil
		d.mu.Unlock()
		return nil, cause
	}
	d.mu.Unlock()
	// Handed a lease as the wait ended: it goes back, to the next waiter.
	l := <-w.ready
	if l.err == nil {
		l.Release()
	}
	return nil, cause
}

func (d *Dispatcher) handed(l *Lease, waited time.Duration) (*Lease, error) {
	if l.err != nil {
		return nil, l.err
	}
	l.waited = waited
	return l, nil
}

// Load implements LoadReader.
func (d *Dispatcher) Load(key Key) Load {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fns[key]
	if f == nil {
		return Load{}
	}
	return f.load()
}

// Loads implements LoadReader.
func (d *Dispatcher) Loads() map[Key]Load {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[Key]Load, len(d.fns))
	for k, f := range d.fns {
		out[k] = f.load()
	}
	return out
}

func (f *function) load() Load {
	l := Load{InFlight: f.inFlight, Queued: f.queue.Len(), Replicas: len(f.replicas)}
	for _, r := range f.replicas {
		if r.Takes && !r.broken {
			l.Taking++
		}
	}
	return l
}

// InFlightOn says whether the replica with this ID has an invocation in
// flight: a draining replica may go once it has none.
func (d *Dispatcher) InFlightOn(key Key, id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fns[key]
	if f == nil {
		return false
	}
	r := f.replicas[id]
	return r != nil && r.lease != nil
}
