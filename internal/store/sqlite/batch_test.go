package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// Concurrent writes share transactions (group commit), and those that fail
// in a batch — a name taken, a stale resourceVersion — leave the others
// as they were: every write that succeeded is stored and delivered once,
// under consecutive versions in commit order, and none that failed is.
func TestConcurrentWritesSucceedOrFailAlone(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	shared, err := s.Runs().Create(ctx, newRun("default", "shared"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Runs().Watch(ctx, store.WatchOptions{ResourceVersion: shared.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	const n = 64
	type result struct {
		what string
		rv   string
		err  error
	}
	results := make(chan result, 3*n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := s.Runs().Create(ctx, newRun("default", fmt.Sprintf("own-%d", i)))
			results <- result{"own", versionOf(r), err}
		})
		wg.Go(func() {
			r, err := s.Runs().Create(ctx, newRun("default", "taken"))
			results <- result{"taken", versionOf(r), err}
		})
		wg.Go(func() {
			next := shared.DeepCopy()
			next.Status.Phase = v1alpha1.PhaseRunning
			next.Status.Attempt = int32(i + 1)
			r, err := s.Runs().UpdateStatus(ctx, next)
			results <- result{"shared", versionOf(r), err}
		})
	}
	wg.Wait()
	close(results)
	won := map[string]int{}
	rvs := map[string]bool{}
	for r := range results {
		switch {
		case r.err == nil:
			won[r.what]++
			rvs[r.rv] = true
		case r.what == "taken" && errors.Is(r.err, errdefs.ErrAlreadyExists):
		case r.what == "shared" && errors.Is(r.err, errdefs.ErrConflict):
		default:
			t.Errorf("%s: %v", r.what, r.err)
		}
	}
	if won["own"] != n || won["taken"] != 1 || won["shared"] != 1 {
		t.Fatalf("writes that succeeded: %v, want %d own, 1 taken, 1 shared", won, n)
	}
	// The watch delivers exactly the successful writes, versions
	// consecutive from the shared Run's creation on.
	want, _ := strconv.ParseInt(shared.ResourceVersion, 10, 64)
	deadline := time.After(30 * time.Second)
	for seen := 0; seen < len(rvs); seen++ {
		select {
		case ev := <-w.Events():
			if ev.Type == store.Error {
				t.Fatalf("watch: %v", ev.Err)
			}
			want++
			if got := ev.Object.ResourceVersion; got != strconv.FormatInt(want, 10) || !rvs[got] {
				t.Fatalf("event %d: %s %s at rv %s, want rv %d, one a write returned", seen, ev.Type, ev.Object.Name, got, want)
			}
		case <-deadline:
			t.Fatalf("%d of %d events delivered", seen, len(rvs))
		}
	}
	list, rv, err := s.Runs().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n+2 || rv != strconv.FormatInt(want, 10) {
		t.Errorf("list: %d Runs at rv %s, want %d at %d", len(list), rv, n+2, want)
	}
	got, err := s.Runs().Get(ctx, "default", "shared")
	if err != nil || got.Status.Phase != v1alpha1.PhaseRunning || !rvs[got.ResourceVersion] {
		t.Errorf("shared: %v %+v", err, got)
	}
}

func versionOf(r *v1alpha1.Run) string {
	if r == nil {
		return ""
	}
	return r.ResourceVersion
}
