package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// BenchRun is a task Run of realistic size for the store benchmarks, about
// 1 KiB of JSON with an inline script, in namespace "default". A name
// ending in "-" is a prefix the store completes (metadata.generateName).
func BenchRun(name string) *v1alpha1.Run {
	r := &v1alpha1.Run{}
	r.Namespace = store.DefaultNamespace
	if strings.HasSuffix(name, "-") {
		r.GenerateName = name
	} else {
		r.Name = name
	}
	r.Labels = map[string]string{"stoke.dev/runtime": "bash"}
	r.Spec = v1alpha1.RunSpec{
		Runtime: "bash",
		Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh", Args: []string{"--flag", "value"}}},
		Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: strings.Repeat("echo hello world\n", 32)}},
		Env:     []v1alpha1.EnvVar{{Name: "GREETING", Value: "hello"}},
	}
	return r
}

// Lifecycle makes a task Run's writes as the control plane makes them:
// the create, then three status writes, Scheduled (the scheduler),
// Running and Succeeded (runtimed), each on the version the last returned.
func Lifecycle(ctx context.Context, runs store.Resource[*v1alpha1.Run], run *v1alpha1.Run) error {
	r, err := runs.Create(ctx, run)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	for _, p := range []v1alpha1.Phase{v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded} {
		r.Status.Phase = p
		name := r.Name
		if r, err = runs.UpdateStatus(ctx, r); err != nil {
			return fmt.Errorf("run %s: %s: %w", name, p, err)
		}
	}
	return nil
}

// Lifecycles makes n lifecycles of BenchRun(prefix + i) from workers
// goroutines at once and returns how long they took: the store's own rate
// for a task Run's writes at that concurrency, the ceiling of a control
// plane that makes those writes through it.
func Lifecycles(ctx context.Context, runs store.Resource[*v1alpha1.Run], prefix string, n, workers int) (time.Duration, error) {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := Lifecycle(ctx, runs, BenchRun(fmt.Sprintf("%s%d", prefix, i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	return took, <-errs
}
