package sqlite_test

import (
	"context"
	"errors"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

// TestWatchAssignedPodPrunedStart covers what the suite cannot reach: a
// watch filtered by assigned pod replays a change to a Run whose state at
// the watch's start the log no longer holds, so it cannot tell whether the
// Run was in its set (ADDED, MODIFIED or DELETED?). The watch ends as
// expired, and the watcher re-lists.
func TestWatchAssignedPodPrunedStart(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), sqlite.WithEventRetention(16))
	const uid = "4a2c1a3e-0000-4000-8000-000000000001"
	runs := s.Runs()
	r, err := runs.Create(ctx, newRun("default", "assigned"))
	if err != nil {
		t.Fatal(err)
	}
	r.Status.Phase, r.Status.AssignedPodUID = v1alpha1.PhaseScheduled, uid
	if r, err = runs.UpdateStatus(ctx, r); err != nil {
		t.Fatal(err)
	}
	// Enough writes to another Run to prune the assigned Run's changes.
	other, err := runs.Create(ctx, newRun("default", "other"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		other.Status.Attempt = int32(i + 1)
		if other, err = runs.UpdateStatus(ctx, other); err != nil {
			t.Fatal(err)
		}
	}
	_, from, err := runs.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.Status.AssignedPodUID = ""
	if _, err := runs.UpdateStatus(ctx, r); err != nil {
		t.Fatal(err)
	}

	w, err := runs.Watch(ctx, store.WatchOptions{ResourceVersion: from, AssignedPodUID: uid})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev, ok := <-w.Events()
	if !ok || ev.Type != store.Error {
		t.Fatalf("first event %s %v, want ERROR", ev.Type, ev.Object)
	}
	if !errors.Is(ev.Err, errdefs.ErrExpired) {
		t.Fatalf("error %v, want ErrExpired", ev.Err)
	}
	if _, ok := <-w.Events(); ok {
		t.Fatal("the watch went on after its ERROR event")
	}

	// Unfiltered, the same replay needs no earlier state.
	all, err := runs.Watch(ctx, store.WatchOptions{ResourceVersion: from})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Stop()
	if ev := <-all.Events(); ev.Type != store.Modified || ev.Object.Name != "assigned" {
		t.Fatalf("unfiltered replay: %s %v, want MODIFIED assigned", ev.Type, ev.Object)
	}
}
