package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/internal/errdefs"
)

var fnKey = Key{Namespace: "default", Name: "hello"}

func replicas(n int) []Replica {
	out := make([]Replica, n)
	for i := range out {
		out[i] = Replica{ID: fmt.Sprintf("uid-%d", i), Name: fmt.Sprintf("hello-%d", i), Takes: true}
	}
	return out
}

func newFake() (*Dispatcher, *testingclock.FakeClock) {
	c := testingclock.NewFakeClock(time.Unix(1e9, 0))
	return New(Config{Clock: c}), c
}

// until waits for cond, which other goroutines make true.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		runtime.Gosched()
	}
}

func acquireAsync(d *Dispatcher, ctx context.Context, timeout time.Duration) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := d.Acquire(ctx, fnKey, timeout)
		ch <- result{l, err}
	}()
	return ch
}

type result struct {
	l   *Lease
	err error
}

func isQueueRefusal(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("error %v, want ResourceExhausted", err)
	}
	if d, ok := errdefs.RetryAfter(err); !ok || d != QueueRetry {
		t.Fatalf("error %v has Retry-After %v %v, want %v", err, d, ok, QueueRetry)
	}
}

// Waiters are served in arrival order, each by the replica the one
// before released, and none is refused while the queue has room.
func TestQueueIsFIFO(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{QueueLength: 10}, replicas(1))
	first, err := d.Acquire(context.Background(), fnKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	var waits []<-chan result
	for i := range 5 {
		waits = append(waits, acquireAsync(d, context.Background(), 0))
		until(t, "queued", func() bool { return d.Load(fnKey).Queued == i+1 })
	}
	if l := d.Load(fnKey); l.InFlight != 1 || l.Queued != 5 || l.Replicas != 1 || l.Taking != 1 {
		t.Fatalf("load %+v", l)
	}
	prev := first
	for i, ch := range waits {
		select {
		case <-ch:
			t.Fatalf("waiter %d served before the replica was released", i)
		default:
		}
		prev.Release()
		r := <-ch
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		// Every later waiter is still waiting: none jumped the queue.
		for j, later := range waits[i+1:] {
			select {
			case <-later:
				t.Fatalf("waiter %d served before waiter %d", i+j+1, i)
			default:
			}
		}
		prev = r.l
	}
	prev.Release()
	if l := d.Load(fnKey); l.InFlight != 0 || l.Queued != 0 {
		t.Fatalf("load after all %+v", l)
	}
}

// A new arrival does not take a replica a waiter is owed: with one
// waiting, a released replica goes to the waiter, not to Acquire.
func TestNoOvertaking(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{}, replicas(1))
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	w := acquireAsync(d, context.Background(), 0)
	until(t, "queued", func() bool { return d.Load(fnKey).Queued == 1 })
	l.Release()
	late := acquireAsync(d, context.Background(), 0)
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	until(t, "late one queued", func() bool { return d.Load(fnKey).Queued == 1 })
	r.l.Release()
	if r := <-late; r.err != nil {
		t.Fatal(r.err)
	} else {
		r.l.Release()
	}
}

// 64 clients over 8 replicas: never two leases on one replica, every
// acquisition served, none refused (the queue holds them all).
func TestNeverTwoInFlightOnAReplica(t *testing.T) {
	d := New(Config{})
	d.Sync(fnKey, Settings{QueueLength: 64, QueueWait: time.Minute}, replicas(8))
	var holders [8]atomic.Int32
	var served atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 200 {
				l, err := d.Acquire(context.Background(), fnKey, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				var i int
				fmt.Sscanf(l.Replica().ID, "uid-%d", &i)
				if n := holders[i].Add(1); n != 1 {
					t.Errorf("replica %d has %d invocations in flight", i, n)
				}
				runtime.Gosched()
				holders[i].Add(-1)
				served.Add(1)
				l.Release()
			}
		})
	}
	wg.Wait()
	if served.Load() != 64*200 {
		t.Fatalf("served %d of %d", served.Load(), 64*200)
	}
	if l := d.Load(fnKey); l.InFlight != 0 || l.Queued != 0 {
		t.Fatalf("load after all %+v", l)
	}
}

// The queue's length bound refuses the next arrival at once, with a
// Retry-After; those already queued keep their places.
func TestFullQueueRefuses(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{QueueLength: 2}, replicas(1))
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	a := acquireAsync(d, context.Background(), 0)
	until(t, "one queued", func() bool { return d.Load(fnKey).Queued == 1 })
	b := acquireAsync(d, context.Background(), 0)
	until(t, "two queued", func() bool { return d.Load(fnKey).Queued == 2 })
	_, err := d.Acquire(context.Background(), fnKey, 0)
	isQueueRefusal(t, err)
	l.Release()
	ra := <-a
	ra.l.Release()
	rb := <-b
	if ra.err != nil || rb.err != nil {
		t.Fatal(ra.err, rb.err)
	}
	rb.l.Release()
}

// The wait bound: a waiter is refused when it runs out, and the wait
// counts against the invocation's own timeout when that is shorter.
func TestWaitBound(t *testing.T) {
	for _, tt := range []struct {
		name    string
		timeout time.Duration
		wait    time.Duration // when the refusal comes
	}{
		{"queue wait", 0, 2 * time.Second},
		{"invocation timeout shorter", 500 * time.Millisecond, 500 * time.Millisecond},
		{"invocation timeout longer", time.Minute, 2 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, c := newFake()
			d.Sync(fnKey, Settings{QueueWait: 2 * time.Second}, replicas(1))
			l, _ := d.Acquire(context.Background(), fnKey, 0)
			defer l.Release()
			w := acquireAsync(d, context.Background(), tt.timeout)
			until(t, "timer armed", c.HasWaiters)
			c.Step(tt.wait - time.Millisecond)
			select {
			case r := <-w:
				t.Fatalf("refused before its bound: %v", r.err)
			default:
			}
			c.Step(time.Millisecond)
			r := <-w
			isQueueRefusal(t, r.err)
			if n := d.Load(fnKey).Queued; n != 0 {
				t.Fatalf("%d still queued", n)
			}
		})
	}
}

// A waiter served after a wait knows how long it waited, so that its
// call gets only what is left of its timeout.
func TestWaitedIsReported(t *testing.T) {
	d, c := newFake()
	d.Sync(fnKey, Settings{}, replicas(1))
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	w := acquireAsync(d, context.Background(), 0)
	until(t, "timer armed", c.HasWaiters)
	c.Step(300 * time.Millisecond)
	l.Release()
	r := <-w
	if r.err != nil || r.l.Waited() != 300*time.Millisecond {
		t.Fatalf("waited %v, %v", r.l.Waited(), r.err)
	}
	r.l.Release()
}

// A caller that goes away leaves the queue.
func TestCallerGoneLeavesTheQueue(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{}, replicas(1))
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	ctx, cancel := context.WithCancel(context.Background())
	w := acquireAsync(d, ctx, 0)
	until(t, "queued", func() bool { return d.Load(fnKey).Queued == 1 })
	cancel()
	if r := <-w; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("error %v", r.err)
	}
	l.Release()
	if ld := d.Load(fnKey); ld.Queued != 0 || ld.InFlight != 0 {
		t.Fatalf("load %+v", ld)
	}
	// The replica is idle again.
	l, err := d.Acquire(context.Background(), fnKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// A replica that takes no new invocations (draining, or not Ready) keeps
// the one in flight, gets nothing new, and is reported busy until that
// one ends.
func TestDrainingGetsNothingNew(t *testing.T) {
	d, _ := newFake()
	rs := replicas(2)
	d.Sync(fnKey, Settings{}, rs[:1])
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	rs[0].Takes = false
	d.Sync(fnKey, Settings{}, rs)
	if !d.InFlightOn(fnKey, rs[0].ID) {
		t.Fatal("the draining replica's invocation is not reported in flight")
	}
	l.Release()
	if d.InFlightOn(fnKey, rs[0].ID) {
		t.Fatal("in flight after release")
	}
	for range 3 {
		l, err := d.Acquire(context.Background(), fnKey, 0)
		if err != nil {
			t.Fatal(err)
		}
		if l.Replica().ID != rs[1].ID {
			t.Fatalf("leased the draining replica %s", l.Replica().ID)
		}
		l.Release()
	}
	if ld := d.Load(fnKey); ld.Replicas != 2 || ld.Taking != 1 {
		t.Fatalf("load %+v", ld)
	}
}

// A replica that leaves ends its lease's context (the call fails, 503 at
// the gateway) and is never leased again; the others go on.
func TestReplicaGoneEndsItsCall(t *testing.T) {
	d, _ := newFake()
	rs := replicas(2)
	d.Sync(fnKey, Settings{}, rs)
	a, _ := d.Acquire(context.Background(), fnKey, 0)
	b, _ := d.Acquire(context.Background(), fnKey, 0)
	gone, stays := a, b
	if a.Replica().ID != rs[0].ID {
		gone, stays = b, a
	}
	goneCall, cancelGone, ok := gone.Bind(context.Background())
	if !ok {
		t.Fatal("a lease of a replica still there could not bind its call")
	}
	defer cancelGone(nil)
	staysCall, cancelStays, ok := stays.Bind(context.Background())
	if !ok {
		t.Fatal("a lease of a replica still there could not bind its call")
	}
	defer cancelStays(nil)
	d.Sync(fnKey, Settings{}, rs[1:])
	<-goneCall.Done()
	if !gone.Gone() || context.Cause(goneCall) != ErrReplicaGone || stays.Gone() || staysCall.Err() != nil {
		t.Fatalf("gone %v (%v), stays %v", gone.Gone(), context.Cause(goneCall), staysCall.Err())
	}
	gone.Release()
	stays.Release()
	for range 3 {
		l, _ := d.Acquire(context.Background(), fnKey, 0)
		if l.Replica().ID != rs[1].ID {
			t.Fatalf("leased the replica that left")
		}
		l.Release()
	}
	if ld := d.Load(fnKey); ld.Replicas != 1 || ld.InFlight != 0 {
		t.Fatalf("load %+v", ld)
	}
}

// With no replica (scaled to zero), the first invocation waits and the
// first replica that registers serves it.
func TestFirstReplicaServesTheWaiter(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{}, nil)
	w := acquireAsync(d, context.Background(), 0)
	until(t, "queued", func() bool { return d.Load(fnKey).Queued == 1 })
	rs := replicas(1)
	rs[0].Takes = false // registering
	d.Sync(fnKey, Settings{}, rs)
	select {
	case <-w:
		t.Fatal("served by a replica that is not Ready")
	default:
	}
	rs[0].Takes = true
	d.Sync(fnKey, Settings{}, rs)
	r := <-w
	if r.err != nil || r.l.Replica().ID != rs[0].ID {
		t.Fatal(r.err)
	}
	r.l.Release()
}

// A replica another gateway holds (busy before running the call) is left
// alone for a backoff while the invocation, first in the queue, goes to
// another replica or waits for this one.
func TestBusyReplicaIsHeldBack(t *testing.T) {
	d, c := newFake()
	rs := replicas(2)
	d.Sync(fnKey, Settings{}, rs)
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	first := l.Replica().ID
	l2, err := l.Busy(context.Background(), 0)
	if err != nil || l2.Replica().ID == first {
		t.Fatalf("after busy: %v, %v", l2, err)
	}
	// Both out: the next waits, and gets the busy one after its hold.
	w := acquireAsync(d, context.Background(), 0)
	until(t, "queued", func() bool { return d.Load(fnKey).Queued == 1 })
	c.Step(minHold)
	r := <-w
	if r.err != nil || r.l.Replica().ID != first {
		t.Fatalf("%v %v", r.l, r.err)
	}
	r.l.Release()
	l2.Release()
}

// A deleted Function's waiters are refused with the error given.
func TestDeleteRefusesWaiters(t *testing.T) {
	d, _ := newFake()
	d.Sync(fnKey, Settings{}, nil)
	w := acquireAsync(d, context.Background(), 0)
	until(t, "queued", func() bool { return d.Load(fnKey).Queued == 1 })
	d.Delete(fnKey, errdefs.Errorf(errdefs.ErrNotFound, "function deleted"))
	if r := <-w; !errors.Is(r.err, errdefs.ErrNotFound) {
		t.Fatalf("error %v", r.err)
	}
	if _, ok := d.Loads()[fnKey]; ok {
		t.Fatal("still known")
	}
}

// A replica found broken takes nothing until its Run changes (a new
// Version) or BrokenHold has passed.
func TestBrokenReplicaIsLeftOut(t *testing.T) {
	d, c := newFake()
	rs := replicas(2)
	d.Sync(fnKey, Settings{}, rs)
	l, _ := d.Acquire(context.Background(), fnKey, 0)
	broken := l.Replica()
	l.Broken()
	for range 3 {
		l, _ := d.Acquire(context.Background(), fnKey, 0)
		if l.Replica().ID == broken.ID {
			t.Fatal("leased the broken replica")
		}
		l.Release()
	}
	if ld := d.Load(fnKey); ld.Taking != 1 || ld.InFlight != 0 {
		t.Fatalf("load %+v", ld)
	}
	// Its Run changed: it takes again.
	for i := range rs {
		if rs[i].ID == broken.ID {
			rs[i].Version = "2"
		}
	}
	d.Sync(fnKey, Settings{}, rs)
	if ld := d.Load(fnKey); ld.Taking != 2 {
		t.Fatalf("after its Run changed: %+v", ld)
	}
	// Broken again, then back after the hold.
	a, _ := d.Acquire(context.Background(), fnKey, 0)
	b, _ := d.Acquire(context.Background(), fnKey, 0)
	a.Broken()
	b.Release()
	c.Step(BrokenHold)
	if ld := d.Load(fnKey); ld.Taking != 2 {
		t.Fatalf("after the hold: %+v", ld)
	}
}

// OnQueue hears of each invocation that starts waiting (the autoscaler's
// Poke, for a scale from zero), and of none that found an idle replica.
func TestOnQueue(t *testing.T) {
	c := testingclock.NewFakeClock(time.Unix(1e9, 0))
	var mu sync.Mutex
	var queued []Key
	d := New(Config{Clock: c, OnQueue: func(k Key) {
		mu.Lock()
		queued = append(queued, k)
		mu.Unlock()
	}})
	d.Sync(fnKey, Settings{QueueLength: 10}, replicas(1))
	first, err := d.Acquire(context.Background(), fnKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(queued) != 0 {
		t.Fatalf("OnQueue called for a leased invocation: %v", queued)
	}
	mu.Unlock()
	wait := acquireAsync(d, context.Background(), 0)
	until(t, "OnQueue", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(queued) == 1 && queued[0] == fnKey
	})
	first.Release()
	r := <-wait
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.l.Release()
	mu.Lock()
	defer mu.Unlock()
	if len(queued) != 1 {
		t.Fatalf("OnQueue calls %v, want one", queued)
	}
}

// A lease whose replica left before its call binds nothing: the
// invocation must not be sent there. A lease released before its replica
// leaves is not told it left.
func TestBindAfterTheReplicaLeft(t *testing.T) {
	d, _ := newFake()
	rs := replicas(2)
	d.Sync(fnKey, Settings{}, rs)
	a, _ := d.Acquire(context.Background(), fnKey, 0)
	b, _ := d.Acquire(context.Background(), fnKey, 0)
	left, stays := a, b
	if a.Replica().ID != rs[0].ID {
		left, stays = b, a
	}
	stays.Release()
	d.Sync(fnKey, Settings{}, nil)
	if _, _, ok := left.Bind(context.Background()); ok || !left.Gone() {
		t.Fatalf("bound a call to a replica that left (gone %v)", left.Gone())
	}
	if stays.Gone() {
		t.Fatal("a lease released before its replica left says it left")
	}
	left.Release()
	if ld := d.Load(fnKey); ld.Replicas != 0 || ld.InFlight != 0 {
		t.Fatalf("load %+v", ld)
	}
}
