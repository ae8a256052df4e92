package lambda

import (
	"context"
	"sync"

	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
)

// maxWarm bounds the goroutines that make invocations, and the idle
// connections the invocation client keeps to Lambda: past it, a call runs
// on its caller's goroutine and may open a connection of its own.
const maxWarm = 64

// warm makes invocations on goroutines that outlive one call. The SDK's
// middleware stack is deep: made on a fresh goroutine (gRPC's, when its
// stream workers are busy: Lambda calls are long, so several are in
// flight), a call grows that goroutine's stack several times over, which
// cost more CPU than the rest of the Runtime Server's share of a warm
// invocation (docs/benchmarks.md); a goroutine that has made one call has
// the stack for the next. A call is handed over in a pooled struct, so
// that the hand-off allocates nothing.
type warm struct {
	inv   *awslambda.Client
	calls chan *call
	stop  chan struct{}

	mu     sync.Mutex
	n      int // goroutines started
	closed bool
	wg     sync.WaitGroup
}

// call is one invocation handed to a warm goroutine.
type call struct {
	ctx  context.Context
	in   *awslambda.InvokeInput
	out  *awslambda.InvokeOutput
	err  error
	done chan struct{} // buffered: run never waits for the caller
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func (c *call) run(inv *awslambda.Client) {
	c.out, c.err = inv.Invoke(c.ctx, c.in)
	c.done <- struct{}{}
}

func newWarm(inv *awslambda.Client) *warm {
	return &warm{inv: inv, calls: make(chan *call), stop: make(chan struct{})}
}

// invoke makes one synchronous invocation on an idle goroutine, or a new
// one, and waits until it ends.
func (w *warm) invoke(ctx context.Context, in *awslambda.InvokeInput) (*awslambda.InvokeOutput, error) {
	c := calls.Get().(*call)
	c.ctx, c.in = ctx, in
	select {
	case w.calls <- c:
	default:
		if !w.grow() {
			c.run(w.inv)
			break
		}
		select {
		case w.calls <- c: // the new goroutine, or one that became idle
		case <-w.stop:
			c.run(w.inv)
		}
	}
	<-c.done
	out, err := c.out, c.err
	*c = call{done: c.done}
	calls.Put(c)
	return out, err
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
		case c := <-w.calls:
			c.run(w.inv)
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
