package loop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// ErrEventsEnded is what Run returns when its event channel closes before
// its context ends (the component's source of events went away).
var ErrEventsEnded = errors.New("the event stream ended")

// DefaultJobBuffer is how many submitted jobs may wait for a worker before
// Submit blocks (the loop then slows down; nothing is dropped).
const DefaultJobBuffer = 256

// Hooks are a component's decisions. Each runs on the loop goroutine; a
// nil hook does nothing.
type Hooks[K comparable, E, R any] struct {
	// Sync decides one key: a key from the queue, or a key whose timer is
	// due.
	Sync func(ctx context.Context, k K)
	// Event reacts to one event from Run's event channel.
	Event func(ctx context.Context, ev E)
	// Result takes back the result of a function given to Submit.
	Result func(ctx context.Context, r R)
	// Settle runs before the loop waits for its next input, after every
	// batch of keys, events, results or due timers: the place for work
	// that the batch's decisions made due (e.g. handing out the slots a
	// batch freed).
	Settle func(ctx context.Context)
}

// Config configures a Loop.
type Config[K comparable, E, R any] struct {
	Hooks Hooks[K, E, R]
	// Clock arms the timers; it defaults to the real clock.
	Clock clock.Clock
	// Workers is the number of goroutines that run submitted functions;
	// zero means the component submits none.
	Workers int
	// JobBuffer is how many submitted jobs may wait; zero means
	// DefaultJobBuffer.
	JobBuffer int
}

// Loop is one control loop. Create it with New; Run drives it.
type Loop[K comparable, E, R any] struct {
	hooks   Hooks[K, E, R]
	clk     clock.Clock
	workers int
	queue   *Queue[K]
	results results[R]
	started atomic.Bool

	// Owned by the loop goroutine.
	timers Timers[K]
	jobs   chan func(context.Context) R
}

// New returns a Loop that does nothing until Run.
func New[K comparable, E, R any](cfg Config[K, E, R]) *Loop[K, E, R] {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.JobBuffer <= 0 {
		cfg.JobBuffer = DefaultJobBuffer
	}
	l := &Loop[K, E, R]{
		hooks:   cfg.Hooks,
		clk:     cfg.Clock,
		workers: max(cfg.Workers, 0),
		queue:   NewQueue[K](),
		results: results[R]{ready: make(chan struct{}, 1)},
	}
	if l.workers > 0 {
		l.jobs = make(chan func(context.Context) R, cfg.JobBuffer)
	}
	return l
}

// Add queues k for Sync. It never blocks and may be called from any
// goroutine (an informer's handler, say).
func (l *Loop[K, E, R]) Add(k K) { l.queue.Add(k) }

// After makes Sync look at k again at t, unless k is armed for t or
// earlier already.
func (l *Loop[K, E, R]) After(t time.Time, k K) { l.timers.After(t, k) }

// Set makes Sync look at k at exactly t, whether k was armed earlier or
// later (a deadline that moved).
func (l *Loop[K, E, R]) Set(t time.Time, k K) { l.timers.Set(t, k) }

// Stop disarms k's timer.
func (l *Loop[K, E, R]) Stop(k K) { l.timers.Stop(k) }

// SyncQueued syncs every key waiting in the queue now (e.g. once before a
// component announces that it has synced).
func (l *Loop[K, E, R]) SyncQueued(ctx context.Context) {
	for _, k := range l.queue.Take() {
		l.sync(ctx, k)
	}
}

// Submit hands work to a worker; its result comes back through
// Hooks.Result on the loop goroutine. It blocks while the job buffer is
// full, and gives up (dropping work, whose result would have nowhere to
// go) only when ctx ends. It panics when the Loop has no workers.
func (l *Loop[K, E, R]) Submit(ctx context.Context, work func(ctx context.Context) R) {
	if l.jobs == nil {
		panic("loop: Submit on a Loop without workers")
	}
	select {
	case l.jobs <- work:
	case <-ctx.Done():
	}
}

// Run drives the loop until ctx ends, then waits for its workers to finish
// the jobs already submitted (their results are dropped) and returns nil.
// It returns ErrEventsEnded when events, if not nil, closes before ctx
// ends. Run may be called once.
func (l *Loop[K, E, R]) Run(ctx context.Context, events <-chan E) error {
	if !l.started.CompareAndSwap(false, true) {
		return errors.New("loop: Run called twice")
	}
	if l.workers > 0 {
		var wg sync.WaitGroup
		for range l.workers {
			wg.Go(func() {
				for work := range l.jobs {
					l.results.put(work(ctx))
				}
			})
		}
		defer wg.Wait()
		defer close(l.jobs)
	}

	var timer clock.Timer
	var timerAt time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if l.hooks.Settle != nil {
			l.hooks.Settle(ctx)
		}
		next, ok := l.timers.Next()
		if ok && !next.After(l.clk.Now()) {
			// Already due: a timer armed for now might not fire on a fake
			// clock, and a round trip through a timer gains nothing.
			l.fire(ctx)
			continue
		}
		if !ok && timer != nil {
			timer.Stop() // nothing is armed: no stray wake-up
			timer = nil
		}
		if ok && (timer == nil || !timerAt.Equal(next)) {
			if timer != nil {
				timer.Stop()
			}
			timer, timerAt = l.clk.NewTimer(next.Sub(l.clk.Now())), next
		}
		var timerC <-chan time.Time
		if timer != nil {
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.queue.Ready():
			l.SyncQueued(ctx)
		case ev, open := <-events:
			if !open {
				if ctx.Err() != nil {
					return nil
				}
				return ErrEventsEnded
			}
			if l.hooks.Event != nil {
				l.hooks.Event(ctx, ev)
			}
		case <-l.results.ready:
			for _, r := range l.results.take() {
				if l.hooks.Result != nil {
					l.hooks.Result(ctx, r)
				}
			}
		case <-timerC:
			timer = nil
			l.fire(ctx)
		}
	}
}

// fire syncs the keys whose timers are due.
func (l *Loop[K, E, R]) fire(ctx context.Context) {
	for _, k := range l.timers.PopDue(l.clk.Now()) {
		l.sync(ctx, k)
	}
}

func (l *Loop[K, E, R]) sync(ctx context.Context, k K) {
	if l.hooks.Sync != nil {
		l.hooks.Sync(ctx, k)
	}
}

// results hands results from the workers to the loop goroutine without
// ever blocking a worker. It holds at most one result per submitted job,
// and the loop takes them all at each wake-up.
type results[R any] struct {
	mu    sync.Mutex
	items []R
	ready chan struct{}
}

func (q *results[R]) put(r R) {
	q.mu.Lock()
	q.items = append(q.items, r)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *results[R]) take() []R {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
