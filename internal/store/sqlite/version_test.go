package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// TestResourceVersionsGrow checks what SQLite promises beyond the
// conformance suite, which treats versions as opaque: one decimal counter
// shared by both kinds, larger with every write (deletes included), and a
// list's version at least that of the last write.
func TestResourceVersionsGrow(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	last := uint64(0)
	step := func(what, v string) {
		t.Helper()
		n := rvOf(t, v)
		if n <= last {
			t.Fatalf("%s: resourceVersion %d is not above the previous %d", what, n, last)
		}
		last = n
	}
	w, err := s.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 6 {
		name := fmt.Sprintf("obj-%d", i)
		if i%2 == 1 {
			pool := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 1}}
			pool.Namespace, pool.Name = "default", name
			p, err := s.Runtimes().Create(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			step("create runtime", p.ResourceVersion)
			continue
		}
		r, err := s.Runs().Create(ctx, newRun("default", name))
		if err != nil {
			t.Fatal(err)
		}
		step("create run", r.ResourceVersion)
		r.Status.Phase = v1alpha1.PhaseRunning
		if r, err = s.Runs().UpdateStatus(ctx, r); err != nil {
			t.Fatal(err)
		}
		step("update status", r.ResourceVersion)
		ttl := int32(i + 1)
		r.Spec.TTLSecondsAfterFinished = &ttl
		if r, err = s.Runs().Update(ctx, r); err != nil {
			t.Fatal(err)
		}
		step("update", r.ResourceVersion)
		if err := s.Runs().Delete(ctx, "default", name, store.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for ev := range w.Events() { // the delete's version comes with its event
			if ev.Type == store.Deleted {
				step("delete", ev.Object.ResourceVersion)
				break
			}
		}
	}
	_, listRV, err := s.Runs().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rvOf(t, listRV) < last {
		t.Fatalf("list resourceVersion %s is older than the last write %d", listRV, last)
	}
}

// TestVersionOrder checks store.VersionOrder, which the informer's
// WaitForResourceVersion relies on: the counter's order, for both kinds,
// and an error for a version that is not the store's.
func TestVersionOrder(t *testing.T) {
	s := open(t, t.TempDir())
	for _, res := range []any{s.Runs(), s.Runtimes()} {
		order, ok := res.(store.VersionOrder)
		if !ok {
			t.Fatalf("%T offers no store.VersionOrder", res)
		}
		for _, c := range []struct {
			a, b string
			want int
		}{{"9", "10", -1}, {"10", "10", 0}, {"11", "10", 1}} {
			if got, err := order.CompareResourceVersions(c.a, c.b); err != nil || got != c.want {
				t.Errorf("compare %s and %s: %d, %v; want %d", c.a, c.b, got, err, c.want)
			}
		}
		if _, err := order.CompareResourceVersions("10", "opaque"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("compare with a version not the store's: %v, want ErrInvalidArgument", err)
		}
	}
}
