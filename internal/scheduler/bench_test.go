package scheduler_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// BenchmarkScheduleBurst creates 1,000 task Runs at once (from 8
// goroutines) against two ready pods of 32 slots, with one goroutine that
// completes each Run (Succeeded) as soon as the watch shows it Scheduled,
// as runtimed would; one op is the whole burst, from the first create to
// the last completion. It reports Runs/s and the scheduler's own latency
// (first seen → assignment stored) at p50 and p99. Everything runs on a
// real SQLite store in a temporary directory.
func BenchmarkScheduleBurst(b *testing.B) {
	const (
		runs     = 1000
		creators = 8
	)
	var (
		latMu sync.Mutex
		lats  []time.Duration
	)
	e := newEnv(b, envOptions{
		runtimes:  []string{"bash"},
		ready:     []podsource.Pod{pod("bash", "a", 32), pod("bash", "b", 32)},
		noTracker: true,
		onScheduled: func(_ *v1alpha1.Run, d time.Duration) {
			latMu.Lock()
			lats = append(lats, d)
			latMu.Unlock()
		},
	})

	// The completer.
	w, err := e.runs.Watch(e.ctx, store.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	completed := make(chan struct{}, runs)
	var cw sync.WaitGroup
	cw.Add(1)
	go func() {
		defer cw.Done()
		for ev := range w.Events() {
			if ev.Type == store.Error {
				b.Errorf("completer watch: %v", ev.Err)
				return
			}
			r := ev.Object
			if ev.Type == store.Deleted || r.Status.Phase != v1alpha1.PhaseScheduled {
				continue
			}
			r.Status.Phase = v1alpha1.PhaseSucceeded
			if _, err := e.runs.UpdateStatus(e.ctx, r); err != nil {
				if e.ctx.Err() == nil {
					b.Errorf("complete %s: %v", r.Name, err)
				}
				continue
			}
			completed <- struct{}{}
		}
	}()
	defer func() {
		w.Stop()
		cw.Wait()
	}()

	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		var wg sync.WaitGroup
		for c := range creators {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := c; n < runs; n += creators {
					r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
					r.Name = fmt.Sprintf("b%d-%04d", i, n)
					if _, err := e.runs.Create(e.ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		deadline := time.After(2 * time.Minute)
		for range runs {
			select {
			case <-completed:
			case <-deadline:
				b.Fatal("burst did not complete")
			}
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(runs*b.N)/elapsed.Seconds(), "runs/s")
	latMu.Lock()
	defer latMu.Unlock()
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "sched-p50-ms")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "sched-p99-ms")
	}
}

// BenchmarkScheduleLatency creates one Run at a time on an idle pool and
// measures, through a watch, the time from Create returning to the Run
// showing Scheduled; the completer then finishes it. It reports p50 and p99
// in milliseconds.
func BenchmarkScheduleLatency(b *testing.B) {
	e := newEnv(b, envOptions{
		runtimes:  []string{"bash"},
		ready:     []podsource.Pod{pod("bash", "a", 8), pod("bash", "b", 8)},
		noTracker: true,
	})
	w, err := e.runs.Watch(e.ctx, store.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	lats := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
		r.Name = fmt.Sprintf("l-%06d", i)
		if _, err := e.runs.Create(e.ctx, r); err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		for ev := range w.Events() {
			if ev.Type == store.Error {
				b.Fatal(ev.Err)
			}
			if ev.Object.Name != r.Name || ev.Object.Status.Phase != v1alpha1.PhaseScheduled {
				continue
			}
			lats = append(lats, time.Since(created))
			done := ev.Object
			done.Status.Phase = v1alpha1.PhaseSucceeded
			if _, err := e.runs.UpdateStatus(e.ctx, done); err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	b.StopTimer()
	slices.Sort(lats)
	b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "p99-ms")
}
