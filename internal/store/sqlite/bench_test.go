package sqlite_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/store/storetest"
)

// The benchmarks use a Run of realistic size (about 1 KiB of JSON, an
// inline script) on the default options, with one live watcher attached
// like the control plane's informer, draining as fast as it can.

func benchStore(b *testing.B, opts ...sqlite.Option) *sqlite.Store {
	b.Helper()
	s := open(b, b.TempDir(), opts...)
	w, err := s.Runs().Watch(context.Background(), store.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range w.Events() {
		}
	}()
	b.Cleanup(func() {
		w.Stop()
		<-done
	})
	return s
}

func BenchmarkCreate(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	defer storetest.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		if _, err := s.Runs().Create(ctx, newRun("default", fmt.Sprintf("run-%d", i))); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkUpdateStatus(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	run, err := s.Runs().Create(ctx, newRun("default", "run"))
	if err != nil {
		b.Fatal(err)
	}
	defer storetest.CPUPerOp(b)()
	for b.Loop() {
		run.Status.Phase = v1alpha1.PhaseRunning
		run.Status.Attempt++
		if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	const n = 1000
	for i := range n {
		if _, err := s.Runs().Create(ctx, newRun("default", fmt.Sprintf("run-%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	defer storetest.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		if _, err := s.Runs().Get(ctx, "default", fmt.Sprintf("run-%d", i%n)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkRunLifecycle is the store's share of one task Run: create, the
// status writes Scheduled → Running → Succeeded, and the delete; it
// reports Runs per second through the store alone.
func BenchmarkRunLifecycle(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	defer storetest.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("run-%d", i)
		run, err := s.Runs().Create(ctx, newRun("default", name))
		if err != nil {
			b.Fatal(err)
		}
		for _, phase := range []v1alpha1.Phase{v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded} {
			run.Status.Phase = phase
			if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Runs().Delete(ctx, "default", name, store.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "runs/s")
}

// BenchmarkCreateParallel measures creates from 32 goroutines (16 per
// CPU here): the store runs the writes that arrive while a transaction
// commits in the next one (group commit).
func BenchmarkCreateParallel(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	defer storetest.CPUPerOp(b)()
	var next atomic.Int64
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			name := fmt.Sprintf("run-%d", next.Add(1))
			if _, err := s.Runs().Create(ctx, newRun("default", name)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRunLifecycleParallel is a task Run's writes (create, then
// Scheduled, Running, Succeeded) from 32 goroutines at once (16 per CPU
// here): the rate at which the store's one serial write path takes whole
// task Runs when writes share transactions, the ceiling of `stoke up`'s
// task throughput on this machine ("lifecycles/s"; BenchmarkUpApply300
// measures it beside its own figure).
func BenchmarkRunLifecycleParallel(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b)
	defer storetest.CPUPerOp(b)()
	var next atomic.Int64
	b.SetParallelism(16)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := storetest.Lifecycle(ctx, s.Runs(), storetest.BenchRun(fmt.Sprintf("run-%d", next.Add(1)))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "lifecycles/s")
}
