package standalone_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// The figures issue 3 asks for, through the in-process API with warm pools:
// task create → Succeeded latency and throughput, and Python function
// create → Ready. Run with `make bench`.

// waiter signals when named Runs reach a phase, from one store watch.
type waiter struct {
	mu      sync.Mutex
	waiting map[string]chan *v1alpha1.Run
	want    func(*v1alpha1.Run) bool
	stop    func()
}

func newWaiter(b *testing.B, p *plane, want func(*v1alpha1.Run) bool) *waiter {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := p.WatchRuns(ctx, store.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	wt := &waiter{waiting: map[string]chan *v1alpha1.Run{}, want: want}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.Events() {
			if ev.Object == nil || !want(ev.Object) {
				continue
			}
			wt.mu.Lock()
			c := wt.waiting[ev.Object.Name]
			delete(wt.waiting, ev.Object.Name)
			wt.mu.Unlock()
			if c != nil {
				c <- ev.Object
			}
		}
	}()
	wt.stop = func() { cancel(); w.Stop(); <-done }
	b.Cleanup(wt.stop)
	return wt
}

func (w *waiter) expect(name string) chan *v1alpha1.Run {
	c := make(chan *v1alpha1.Run, 1)
	w.mu.Lock()
	w.waiting[name] = c
	w.mu.Unlock()
	return c
}

func report(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(float64(len(lat)-1)*q)].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

var terminal = func(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() }

func BenchmarkTaskCreateToSucceeded(b *testing.B) {
	p := start(b, runtimeOf("bash", 2, 32))
	w := newWaiter(b, p, terminal)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("seq-%d", i)
		done := w.expect(name)
		start := time.Now()
		if _, err := p.CreateRun(ctx, task(name, "true")); err != nil {
			b.Fatal(err)
		}
		run := <-done
		lat = append(lat, time.Since(start))
		if run.Status.Phase != v1alpha1.PhaseSucceeded {
			b.Fatalf("%s: %+v", name, run.Status)
		}
	}
	b.StopTimer()
	report(b, lat)
}

// BenchmarkTaskThroughput runs 1,000 `true` tasks at concurrency 32 per
// iteration and reports Runs/s.
func BenchmarkTaskThroughput(b *testing.B) {
	const total, concurrency = 1000, 32
	p := start(b, runtimeOf("bash", 2, 32))
	w := newWaiter(b, p, terminal)
	ctx := context.Background()
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		var next atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for c := 0; c < concurrency; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n := next.Add(1)
					if n > total {
						return
					}
					name := fmt.Sprintf("tp-%d-%d", i, n)
					done := w.expect(name)
					if _, err := p.CreateRun(ctx, task(name, "true")); err != nil {
						failed.Add(1)
						return
					}
					if run := <-done; run.Status.Phase != v1alpha1.PhaseSucceeded {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed += time.Since(start)
		if failed.Load() > 0 {
			b.Fatalf("%d runs failed", failed.Load())
		}
	}
	b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "runs/s")
	b.ReportMetric(0, "ns/op")
}

func BenchmarkFunctionCreateToReadyPython(b *testing.B) {
	p := start(b, runtimeOf("python", 2, 64))
	w := newWaiter(b, p, func(r *v1alpha1.Run) bool { return r.Status.Phase == v1alpha1.PhaseReady || r.Status.Phase.Terminal() })
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("fn-%d", i)
		done := w.expect(name)
		start := time.Now()
		if _, err := p.CreateRun(ctx, pyFunction(name, "def handle(event):\n    return event\n")); err != nil {
			b.Fatal(err)
		}
		run := <-done
		lat = append(lat, time.Since(start))
		if run.Status.Phase != v1alpha1.PhaseReady {
			b.Fatalf("%s: %+v", name, run.Status)
		}
		b.StopTimer()
		if _, err := p.DeleteRun(ctx, "default", name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	report(b, lat)
}
