package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A run of the timer or of the caller's watch that an earlier call could
// not stop in time (both run in goroutines of their own) does not end the
// next call; a drain does.
func TestCallCtxStaleEndsSpareTheNextCall(t *testing.T) {
	var c callCtx
	first, cancelFirst := context.WithCancel(context.Background())
	c.begin(first, time.Hour)
	c.finish()
	cancelFirst()
	c.begin(context.Background(), time.Hour)
	c.expire()      // the first call's timer, late
	c.callerEnded() // the first call's caller, late
	if err := c.Err(); err != nil {
		t.Fatalf("a stale end reached the next call: %v", err)
	}
	c.drain()
	if err, drained := c.ended(); !errors.Is(err, context.Canceled) || !drained {
		t.Fatalf("after drain: %v, drained %v", err, drained)
	}
	c.finish()
}

// The call ends at its deadline and at its caller's cancel; what is
// registered on it runs then, once, or not at all once stopped; a
// context derived from it ends with it.
func TestCallCtxEnds(t *testing.T) {
	var c callCtx
	c.begin(context.Background(), time.Hour)
	stopped := false
	stop := AfterCall(&c, func() { stopped = true })
	if !stop() || stop() {
		t.Fatal("stop: want true once, then false")
	}
	c.finish()
	if stopped {
		t.Fatal("a stopped func ran")
	}

	c.begin(context.Background(), time.Millisecond)
	ran := make(chan struct{})
	AfterCall(&c, func() { close(ran) })
	child, cancel := context.WithCancel(&c)
	defer cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the deadline did not end the call")
	}
	<-child.Done()
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline: %v", c.Err())
	}
	c.finish()

	caller, cancelCaller := context.WithCancel(context.Background())
	c.begin(caller, time.Hour)
	if c.Err() != nil {
		t.Fatalf("a new call begins ended: %v", c.Err())
	}
	done := c.Done()
	cancelCaller()
	<-done
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("after the caller's cancel: %v", c.Err())
	}
	c.finish()
}

// A warm call's context takes no allocation beyond the watch of its
// caller's (context.AfterFunc), with the adapter's AfterCall and its stop.
func TestCallCtxAllocations(t *testing.T) {
	var c callCtx
	caller, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := func() {}
	c.begin(caller, time.Hour) // the timer is made once
	c.finish()
	n := testing.AllocsPerRun(100, func() {
		c.begin(caller, time.Hour)
		AfterCall(&c, f)()
		c.finish()
	})
	if n > 4 {
		t.Fatalf("%v allocations per call, want at most 4 (context.AfterFunc's on the caller's)", n)
	}
}
