package sqlite

import (
	"context"
	"fmt"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// TestWriteCacheBounds shrinks the write cache and checks that writes stay
// correct when their object was evicted, and that the bounds hold.
func TestWriteCacheBounds(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.runs.maxEntries = 3
	runs := make([]*v1alpha1.Run, 10)
	for i := range runs {
		r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash"}}
		r.Name = fmt.Sprintf("run-%d", i)
		if runs[i], err = s.Runs().Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	check := func() {
		t.Helper()
		s.c.mu.Lock()
		defer s.c.mu.Unlock()
		if len(s.runs.cache) > s.runs.maxEntries {
			t.Fatalf("cache holds %d entries, bound %d", len(s.runs.cache), s.runs.maxEntries)
		}
		total := 0
		for _, cur := range s.runs.cache {
			total += len(cur.body)
		}
		if total != s.runs.cacheBytes {
			t.Fatalf("cacheBytes = %d, entries hold %d", s.runs.cacheBytes, total)
		}
	}
	check()
	// Every run is updated twice; the older ones were evicted.
	for round := range 2 {
		for i, r := range runs {
			r.Status.Attempt = int32(round + 1)
			if runs[i], err = s.Runs().UpdateStatus(ctx, r); err != nil {
				t.Fatalf("update %s (round %d): %v", r.Name, round, err)
			}
		}
		check()
	}
	s.runs.maxBytes = len(s.runs.cache[objectKey{"default", "run-9"}].body)
	for i, r := range runs {
		got, err := s.Runs().Get(ctx, "default", r.Name)
		if err != nil || got.ResourceVersion != r.ResourceVersion || got.Status.Attempt != 2 {
			t.Fatalf("run %d: %v %+v", i, err, got)
		}
		if err := s.Runs().Delete(ctx, "default", r.Name, store.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		check()
	}
}
