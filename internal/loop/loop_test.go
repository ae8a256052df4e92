package loop_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/internal/loop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const waitTimeout = 30 * time.Second

func TestQueueDeduplicatesAndKeepsOrder(t *testing.T) {
	q := loop.NewQueue[string]()
	for _, k := range []string{"b", "a", "b", "c", "a"} {
		q.Add(k)
	}
	if n := q.Len(); n != 3 {
		t.Fatalf("Len %d, want 3", n)
	}
	select {
	case <-q.Ready():
	default:
		t.Fatal("Ready did not receive after Add")
	}
	if got := q.Take(); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Fatalf("Take %v, want [b a c]", got)
	}
	q.Add("a") // taken keys may come again
	if got := q.Take(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Take %v, want [a]", got)
	}
}

func TestTimers(t *testing.T) {
	var tm loop.Timers[string]
	tm.After(t0.Add(3*time.Second), "a")
	tm.After(t0.Add(5*time.Second), "a") // later: keeps 3 s
	tm.After(t0.Add(2*time.Second), "b")
	tm.After(t0.Add(time.Second), "b") // earlier: moves to 1 s
	tm.Set(t0.Add(4*time.Second), "c")
	tm.Set(t0.Add(6*time.Second), "c") // Set moves later too
	tm.After(t0.Add(3*time.Second), "d")
	tm.After(t0.Add(7*time.Second), "e")
	tm.Stop("e")
	if at, ok := tm.At("a"); !ok || !at.Equal(t0.Add(3*time.Second)) {
		t.Errorf("a at %v %v, want +3s", at, ok)
	}
	if _, ok := tm.At("e"); ok {
		t.Error("e is still armed after Stop")
	}
	if next, ok := tm.Next(); !ok || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("Next %v %v, want +1s", next, ok)
	}
	if got := tm.PopDue(t0.Add(500 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("PopDue before anything is due: %v", got)
	}
	// a and d are due at the same time: in the order they were armed.
	if got := tm.PopDue(t0.Add(3 * time.Second)); !slices.Equal(got, []string{"b", "a", "d"}) {
		t.Fatalf("PopDue(+3s) %v, want [b a d]", got)
	}
	if got := tm.PopDue(t0.Add(time.Hour)); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("PopDue(+1h) %v, want [c]", got)
	}
	if tm.Len() != 0 {
		t.Fatalf("Len %d after popping everything", tm.Len())
	}
	tm.After(t0, "a") // a popped key may be armed again
	if tm.Len() != 1 {
		t.Fatalf("Len %d, want 1", tm.Len())
	}
}

// recorder is a component: its state is touched by the hooks only, so the
// race detector catches a hook run off the loop goroutine.
type recorder struct {
	synced  []string
	events  []int
	results []string
	settles int
	seen    chan string // every sync, event and result, for the test to wait on
}

func (r *recorder) note(s string) {
	select {
	case r.seen <- s:
	default:
		panic("recorder: test not reading")
	}
}

// newLoop returns a Loop whose hooks all record into r.
func newLoop(r *recorder) *loop.Loop[string, int, string] {
	return loop.New(loop.Config[string, int, string]{Hooks: loop.Hooks[string, int, string]{
		Sync:   func(_ context.Context, k string) { r.synced = append(r.synced, k); r.note("sync " + k) },
		Event:  func(_ context.Context, ev int) { r.events = append(r.events, ev); r.note("event") },
		Result: func(_ context.Context, s string) { r.results = append(r.results, s); r.note("result " + s) },
		Settle: func(context.Context) { r.settles++ },
	}})
}

func await(t *testing.T, r *recorder, want string) {
	t.Helper()
	select {
	case got := <-r.seen:
		if got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no %q", want)
	}
}

// awaitTimer waits until the loop armed a timer on clk (the fake clock has
// no event for it, so this polls).
func awaitTimer(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the loop armed no timer")
		}
		time.Sleep(time.Millisecond)
	}
}

func run(t *testing.T, l *loop.Loop[string, int, string], events <-chan int) (cancel func() error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, events) }()
	var once sync.Once
	var err error
	cancel = func() error {
		once.Do(func() {
			stop()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = cancel() })
	return cancel
}

func TestSyncsQueuedKeysOnceEach(t *testing.T) {
	r := &recorder{seen: make(chan string, 16)}
	l := newLoop(r)
	// Added before Run: deduplicated, in order.
	l.Add("a")
	l.Add("b")
	l.Add("a")
	stop := run(t, l, nil)
	await(t, r, "sync a")
	await(t, r, "sync b")
	l.Add("c")
	await(t, r, "sync c")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.synced, []string{"a", "b", "c"}) {
		t.Fatalf("synced %v", r.synced)
	}
	if r.settles == 0 {
		t.Error("Settle never ran")
	}
}

// TestTimersFollowTheFakeClock: a key armed from a hook is synced when the
// fake clock reaches its time, not before, and at its earliest time only.
func TestTimersFollowTheFakeClock(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	r := &recorder{seen: make(chan string, 16)}
	var l *loop.Loop[string, int, string]
	l = loop.New(loop.Config[string, int, string]{Clock: clk, Hooks: loop.Hooks[string, int, string]{
		Sync: func(_ context.Context, k string) {
			r.synced = append(r.synced, k)
			if k == "arm" {
				l.After(t0.Add(5*time.Second), "x")
				l.After(t0.Add(2*time.Second), "x") // earlier wins
				l.After(t0.Add(3*time.Second), "y")
				l.Set(t0.Add(4*time.Second), "z")
				l.Stop("z")
			}
			r.note("sync " + k)
		},
	}})
	stop := run(t, l, nil)
	l.Add("arm")
	await(t, r, "sync arm")
	awaitTimer(t, clk)
	clk.Step(time.Second)
	l.Add("barrier") // synced after the step was seen: x is not due yet
	await(t, r, "sync barrier")
	clk.Step(time.Second)
	await(t, r, "sync x")
	awaitTimer(t, clk)
	clk.Step(time.Hour)
	await(t, r, "sync y")
	l.Add("end")
	await(t, r, "sync end")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"arm", "barrier", "x", "y", "end"}; !slices.Equal(r.synced, want) {
		t.Fatalf("synced %v, want %v", r.synced, want)
	}
}

// TestTimerDueAtArmingFiresWithoutTheClock: a key armed for now or the
// past is synced at once, with the fake clock never stepped.
func TestTimerDueAtArmingFiresWithoutTheClock(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	r := &recorder{seen: make(chan string, 16)}
	var l *loop.Loop[string, int, string]
	l = loop.New(loop.Config[string, int, string]{Clock: clk, Hooks: loop.Hooks[string, int, string]{
		Sync: func(_ context.Context, k string) {
			if k == "arm" {
				l.After(t0, "now")
			}
			r.note("sync " + k)
		},
	}})
	l.After(t0.Add(-time.Second), "past") // armed before Run
	run(t, l, nil)
	await(t, r, "sync past")
	l.Add("arm")
	await(t, r, "sync arm")
	await(t, r, "sync now")
}

// TestWorkersHandResultsBack: work runs on the workers, at most Workers at
// once, and every result comes back to the Result hook on the loop
// goroutine (the recorder's slices are unlocked: -race checks it).
func TestWorkersHandResultsBack(t *testing.T) {
	const workers, jobs = 3, 20
	r := &recorder{seen: make(chan string, jobs+1)}
	var (
		mu            sync.Mutex
		running, peak int
	)
	release := make(chan struct{})
	var l *loop.Loop[string, int, string]
	l = loop.New(loop.Config[string, int, string]{Workers: workers, Hooks: loop.Hooks[string, int, string]{
		Sync: func(ctx context.Context, k string) {
			for i := range jobs {
				l.Submit(ctx, func(context.Context) string {
					mu.Lock()
					running++
					peak = max(peak, running)
					mu.Unlock()
					<-release
					mu.Lock()
					running--
					mu.Unlock()
					return string(rune('a' + i))
				})
			}
			r.note("sync " + k)
		},
		Result: func(_ context.Context, s string) { r.results = append(r.results, s); r.note("result") },
	}})
	stop := run(t, l, nil)
	l.Add("go")
	await(t, r, "sync go")
	close(release)
	for range jobs {
		await(t, r, "result")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.results)
	if len(slices.Compact(r.results)) != jobs {
		t.Fatalf("results %v, want %d distinct", r.results, jobs)
	}
	if peak > workers || peak == 0 {
		t.Fatalf("peak concurrency %d, want 1..%d", peak, workers)
	}
}

func TestEvents(t *testing.T) {
	r := &recorder{seen: make(chan string, 16)}
	l := newLoop(r)
	events := make(chan int)
	stop := run(t, l, events)
	events <- 1
	events <- 2
	l.Add("k")
	await(t, r, "event")
	await(t, r, "event")
	await(t, r, "sync k")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.events, []int{1, 2}) {
		t.Fatalf("events %v", r.events)
	}
}

func TestEventsEndingEndsRun(t *testing.T) {
	l := loop.New(loop.Config[string, int, string]{Workers: 2})
	events := make(chan int)
	close(events)
	if err := l.Run(context.Background(), events); !errors.Is(err, loop.ErrEventsEnded) {
		t.Fatalf("Run = %v, want ErrEventsEnded", err)
	}
}

// TestShutdownWaitsForWorkers: Run returns only after the job in flight
// finished (goleak in TestMain checks that nothing is left behind).
func TestShutdownWaitsForWorkers(t *testing.T) {
	started := make(chan struct{})
	var finished bool
	var l *loop.Loop[string, int, string]
	l = loop.New(loop.Config[string, int, string]{Workers: 1, Hooks: loop.Hooks[string, int, string]{
		Sync: func(ctx context.Context, _ string) {
			l.Submit(ctx, func(ctx context.Context) string {
				close(started)
				<-ctx.Done()
				finished = true // read after Run returned: -race checks the order
				return ""
			})
		},
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, nil) }()
	l.Add("k")
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !finished {
		t.Fatal("Run returned before its worker finished")
	}
	if err := l.Run(context.Background(), nil); err == nil {
		t.Fatal("a second Run did not fail")
	}
}
