package lambda

import "sync"

// maxWarm bounds the goroutines that make invocations, and the idle
// connections the invocation client keeps to Lambda: past it, a call runs
// on its caller's goroutine and may open a connection of its own.
const maxWarm = 64

// warm runs invocations on goroutines that outlive one call. The SDK's
// middleware stack is deep: made on the fresh goroutine that gRPC gives
// each RPC, a call grows that goroutine's stack several times over, which
// cost more CPU than the rest of the Runtime Server's share of a warm
// invocation (docs/benchmarks.md); a goroutine that has made one call has
// the stack for the next.
type warm struct {
	jobs chan func()
	stop chan struct{}

	mu     sync.Mutex
	n      int // goroutines started
	closed bool
	wg     sync.WaitGroup
}

func newWarm() *warm {
	return &warm{jobs: make(chan func()), stop: make(chan struct{})}
}

// do runs f on an idle goroutine, or a new one, and waits until it ends.
func (w *warm) do(f func()) {
	done := make(chan struct{})
	job := func() {
		defer close(done)
		f()
	}
	select {
	case w.jobs <- job:
	default:
		if !w.grow() {
			job()
			break
		}
		select {
		case w.jobs <- job: // the new goroutine, or one that became idle
		case <-w.stop:
			job()
		}
	}
	<-done
}

// grow starts one more goroutine unless there are maxWarm or w is closed.
func (w *warm) grow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.n >= maxWarm {
		return false
	}
	w.n++
	w.wg.Add(1)
	go w.run()
	return true
}

func (w *warm) run() {
	defer w.wg.Done()
	for {
		select {
		case job := <-w.jobs:
			job()
		case <-w.stop:
			return
		}
	}
}

// close stops the goroutines once their calls end; later calls run on
// their callers' goroutines.
func (w *warm) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
