package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The suite runs with a small log and watch buffer so that its expiry and
// slow-watcher tests reach those bounds quickly.
const (
	testRetention   = 1000
	testWatchBuffer = 512
)

func open(t testing.TB, dir string, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, t.TempDir(), sqlite.WithEventRetention(testRetention), sqlite.WithWatchBuffer(testWatchBuffer))
	},
		// The log keeps at most retention + retention/16 events.
		storetest.WithHistoryLimit(testRetention+testRetention/16),
	)
}

func newRun(namespace, name string) *v1alpha1.Run {
	r := &v1alpha1.Run{}
	r.Namespace, r.Name = namespace, name
	r.Labels = map[string]string{"stoke.dev/runtime": "bash"}
	r.Spec = v1alpha1.RunSpec{
		Runtime: "bash",
		Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh", Args: []string{"--flag", "value"}}},
		Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: strings.Repeat("echo hello world\n", 32)}},
		Env:     []v1alpha1.EnvVar{{Name: "GREETING", Value: "hello"}},
	}
	return r
}

func TestReopenKeepsObjectsAndHistory(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := sqlite.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Runs().Create(ctx, newRun("default", "kept"))
	if err != nil {
		t.Fatal(err)
	}
	first.Status.Phase = v1alpha1.PhaseRunning
	running, err := s.Runs().UpdateStatus(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runs().Create(ctx, newRun("default", "gone")); err != nil {
		t.Fatal(err)
	}
	if err := s.Runs().Delete(ctx, "default", "gone", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pool := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "python", Replicas: 2, Runs: 8}}
	pool.Name = "py"
	if _, err := s.Runtimes().Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	_, before, err := s.Runs().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	got, err := s.Runs().Get(ctx, "default", "kept")
	if err != nil {
		t.Fatalf("get after reopen: %v", err)
	}
	if got.ResourceVersion != running.ResourceVersion || got.Status.Phase != v1alpha1.PhaseRunning || got.UID != first.UID {
		t.Fatalf("after reopen: rv %s phase %s uid %s, want %s %s %s", got.ResourceVersion, got.Status.Phase, got.UID, running.ResourceVersion, v1alpha1.PhaseRunning, first.UID)
	}
	if _, err := s.Runs().Get(ctx, "default", "gone"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted run after reopen: %v", err)
	}
	if _, err := s.Runtimes().Get(ctx, "default", "py"); err != nil {
		t.Fatalf("runtime after reopen: %v", err)
	}
	_, after, err := s.Runs().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("list resourceVersion %s after reopen, want %s", after, before)
	}

	// The log survived: a watch from the first write replays the rest.
	w, err := s.Runs().Watch(ctx, store.WatchOptions{ResourceVersion: first.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var seen []string
	for len(seen) < 3 {
		ev := <-w.Events()
		seen = append(seen, string(ev.Type)+" "+ev.Object.Name)
	}
	if want := "MODIFIED kept,ADDED gone,DELETED gone"; strings.Join(seen, ",") != want {
		t.Fatalf("replay after reopen = %v, want %s", seen, want)
	}

	// New writes continue the counter.
	next, err := s.Runs().Create(ctx, newRun("default", "new"))
	if err != nil {
		t.Fatal(err)
	}
	if rvOf(t, next.ResourceVersion) <= rvOf(t, before) {
		t.Fatalf("first write after reopen has resourceVersion %s, not after %s", next.ResourceVersion, before)
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	if s, err := sqlite.Open(context.Background(), dir); !errors.Is(err, errdefs.ErrUnavailable) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("second open of one directory: %v, want ErrUnavailable", err)
	}
}

func TestCloseEndsWatchesAndCalls(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runs().Create(ctx, newRun("default", "unread")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range w.Events() { // Close waited for the watch to end: this terminates
	}
	w.Stop()
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	for name, err := range map[string]error{
		"get":    func() error { _, err := s.Runs().Get(ctx, "default", "unread"); return err }(),
		"list":   func() error { _, _, err := s.Runs().List(ctx, store.ListOptions{}); return err }(),
		"create": func() error { _, err := s.Runs().Create(ctx, newRun("default", "late")); return err }(),
		"delete": s.Runs().Delete(ctx, "default", "unread", store.DeleteOptions{}),
		"watch":  func() error { _, err := s.Runs().Watch(ctx, store.WatchOptions{}); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%s after close: %v, want ErrUnavailable", name, err)
		}
	}
}

// TestCreateRefuses covers what the conformance suite leaves to each
// implementation: in Kubernetes an invalid namespace is a missing one, and
// the size limit is the API server's.
func TestCreateRefuses(t *testing.T) {
	s := open(t, t.TempDir())
	for _, tc := range []struct {
		name     string
		run      func() *v1alpha1.Run
		category error
	}{
		{"InvalidNamespace", func() *v1alpha1.Run { return newRun("Not_A_Namespace", "huge") }, errdefs.ErrInvalidArgument},
		{"TooLarge", func() *v1alpha1.Run {
			r := newRun("default", "huge")
			r.Spec.Source.Inline.Text = strings.Repeat("x", bounds.StoredObject)
			return r
		}, errdefs.ErrTooLarge},
		{"InvalidFinalizer", func() *v1alpha1.Run {
			r := newRun("default", "huge")
			r.Finalizers = []string{"not a finalizer"}
			return r
		}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run()
			_, err := s.Runs().Create(context.Background(), r)
			if !errors.Is(err, tc.category) || !strings.Contains(err.Error(), r.Namespace+"/huge") {
				t.Fatalf("create: %v, want %v naming %s/huge", err, tc.category, r.Namespace)
			}
		})
	}
}

func rvOf(t testing.TB, v string) uint64 {
	t.Helper()
	var n uint64
	if _, err := fmt.Sscan(v, &n); err != nil {
		t.Fatalf("resourceVersion %q: %v", v, err)
	}
	return n
}

func TestWatchFromAnotherDatabasesVersion(t *testing.T) {
	s := open(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Runs().Create(ctx, newRun("default", "one")); err != nil {
		t.Fatal(err)
	}
	// A version from a replaced data directory can be ahead of this one;
	// the watcher must re-list, as for any version it cannot serve.
	_, err := s.Runs().Watch(ctx, store.WatchOptions{ResourceVersion: "1000000"})
	if !errors.Is(err, errdefs.ErrExpired) {
		t.Fatalf("watch from a future version: %v, want ErrExpired", err)
	}
}

// TestReplayPrunedUnderneath starts a replay that needs several pages of
// the log, holds it up by not reading, and writes until the pages it has
// not read yet are pruned: the watcher must get a gap-free prefix and then
// ErrExpired, never a silent gap.
func TestReplayPrunedUnderneath(t *testing.T) {
	const retention = 600
	s := open(t, t.TempDir(), sqlite.WithEventRetention(retention))
	ctx := context.Background()
	run, err := s.Runs().Create(ctx, newRun("default", "churn"))
	if err != nil {
		t.Fatal(err)
	}
	for range retention - 10 {
		run.Status.Attempt++
		if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	from := rvOf(t, run.ResourceVersion) - (retention - 20)
	w, err := s.Runs().Watch(ctx, store.WatchOptions{ResourceVersion: fmt.Sprint(from)})
	if err != nil {
		t.Fatalf("watch from %d, inside the log: %v", from, err)
	}
	defer w.Stop()
	for range 2 * retention {
		run.Status.Attempt++
		if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	want := from + 1
	for ev := range w.Events() {
		if ev.Type == store.Error {
			if !errors.Is(ev.Err, errdefs.ErrExpired) {
				t.Fatalf("error event %v, want ErrExpired", ev.Err)
			}
			t.Logf("replay ended at %d: %v", want-1, ev.Err)
			return
		}
		if got := rvOf(t, ev.Object.ResourceVersion); got != want {
			t.Fatalf("replay delivered %d, want %d", got, want)
		}
		want++
	}
	t.Fatal("the watch ended without an error")
}
