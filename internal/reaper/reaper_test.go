package reaper_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/reaper"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait; nothing sleeps.
const waitTimeout = 30 * time.Second

// t0 is the fake clock's start, a whole second like stored timestamps.
var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

type fakePods struct {
	snapshot []podsource.Pod
	ch       chan podsource.Event
}

func (f *fakePods) Subscribe() (<-chan podsource.Event, []podsource.Pod, func()) {
	return f.ch, f.snapshot, func() {}
}

func pod(name string) podsource.Pod {
	return podsource.Pod{Namespace: store.DefaultNamespace, Runtime: "bash", Name: name, UID: "uid-" + name, Server: "bash", Slots: 8}
}

type env struct {
	t       *testing.T
	ctx     context.Context
	runs    store.Resource[*v1alpha1.Run]
	pods    *fakePods
	clk     *testingclock.FakeClock
	w       store.Watcher[*v1alpha1.Run]
	mu      sync.Mutex
	deleted []string // names passed to OnDeleted, with the clock then
	delAt   []time.Time
}

type envOptions struct {
	// wrap, when set, wraps the store the reaper writes through.
	wrap        func(store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run]
	live        []podsource.Pod
	orphanGrace time.Duration
	// finishedRunTTL is the server's default TTL of finished Runs.
	finishedRunTTL time.Duration
	before         func(e *env)
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fc := testingclock.NewFakeClock(t0)
	st, err := sqlite.Open(ctx, t.TempDir(), sqlite.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, runs: st.Runs(), pods: &fakePods{snapshot: o.live, ch: make(chan podsource.Event)}, clk: fc}
	if o.before != nil {
		o.before(e)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	inf := informer.New(st.Runs(), informer.Options{Logger: log})
	runs := st.Runs()
	if o.wrap != nil {
		runs = o.wrap(runs)
	}
	r, err := reaper.New(reaper.Config{
		Runs: runs, RunInformer: inf, Pods: e.pods, Clock: fc, Logger: log,
		OrphanGrace: o.orphanGrace, FinishedRunTTL: o.finishedRunTTL,
		OnDeleted: func(run *v1alpha1.Run) {
			e.mu.Lock()
			e.deleted = append(e.deleted, run.Name)
			e.delAt = append(e.delAt, fc.Now())
			e.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, run := range []func(context.Context) error{inf.Run, r.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errs <- err
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Run: %v", err)
		}
		st.Close()
	})
	return e
}

func (e *env) create(name string, mutate ...func(*v1alpha1.Run)) *v1alpha1.Run {
	e.t.Helper()
	r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
	r.Name = name
	for _, m := range mutate {
		m(r)
	}
	got, err := e.runs.Create(e.ctx, r)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func (e *env) setStatus(name string, mutate func(*v1alpha1.RunStatus)) *v1alpha1.Run {
	e.t.Helper()
	r, err := e.runs.Get(e.ctx, "", name)
	if err != nil {
		e.t.Fatal(err)
	}
	mutate(&r.Status)
	got, err := e.runs.UpdateStatus(e.ctx, r)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

// assigned creates a Run in phase on pod p.
func (e *env) assigned(name string, phase v1alpha1.Phase, p podsource.Pod, mutate ...func(*v1alpha1.Run)) *v1alpha1.Run {
	e.t.Helper()
	e.create(name, mutate...)
	return e.setStatus(name, func(st *v1alpha1.RunStatus) {
		st.Phase, st.AssignedPod, st.AssignedPodUID, st.Attempt = phase, p.Name, p.UID, 1
	})
}

// watch starts following the store from now.
func (e *env) watch() {
	e.t.Helper()
	w, err := e.runs.Watch(e.ctx, store.WatchOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.w = w
	e.t.Cleanup(w.Stop)
}

// waitFor reads the watch until cond holds for an event's Run.
func (e *env) waitFor(what string, cond func(typ store.EventType, r *v1alpha1.Run) bool) *v1alpha1.Run {
	e.t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		select {
		case ev, ok := <-e.w.Events():
			if !ok || ev.Type == store.Error {
				e.t.Fatalf("watch ended while waiting for %s: %v", what, ev.Err)
			}
			if cond(ev.Type, ev.Object) {
				return ev.Object
			}
		case <-deadline.C:
			e.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitAll waits until every named Run satisfied cond once.
func (e *env) waitAll(what string, names []string, cond func(typ store.EventType, r *v1alpha1.Run) bool) map[string]*v1alpha1.Run {
	e.t.Helper()
	got := map[string]*v1alpha1.Run{}
	for len(got) < len(names) {
		r := e.waitFor(what, func(typ store.EventType, r *v1alpha1.Run) bool {
			return slices.Contains(names, r.Name) && cond(typ, r)
		})
		got[r.Name] = r
	}
	return got
}

func (e *env) send(ev podsource.Event) {
	e.t.Helper()
	select {
	case e.pods.ch <- ev:
	case <-time.After(waitTimeout):
		e.t.Fatal("the reaper does not take pod events")
	}
}

// barrier creates a Run being deleted that only carries runtimed's
// finalizer and has no pod; the reaper releases it as soon as it sees it,
// so once it is gone every Run created before it has been looked at.
func (e *env) barrier(name string) {
	e.t.Helper()
	e.create(name, func(r *v1alpha1.Run) { r.Finalizers = []string{reaper.RuntimedFinalizer} })
	if err := e.runs.Delete(e.ctx, "", name, store.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("barrier "+name, func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == name })
}

func (e *env) exists(name string) bool {
	_, err := e.runs.Get(e.ctx, "", name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return true
}

func policy(max int32) func(*v1alpha1.Run) {
	return func(r *v1alpha1.Run) { r.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: max} }
}

func TestPodGoneRetriesOrFails(t *testing.T) {
	p, other := pod("a"), pod("b")
	e := newEnv(t, envOptions{
		live: []podsource.Pod{p, other},
		before: func(e *env) {
			e.assigned("retried", v1alpha1.PhaseRunning, p, policy(3))
			e.assigned("scheduled", v1alpha1.PhaseScheduled, p, policy(2))
			e.assigned("ready", v1alpha1.PhaseReady, p, policy(2))
			e.assigned("failed", v1alpha1.PhaseRunning, p) // maxAttempts 1
			e.assigned("cancelling", v1alpha1.PhaseRunning, p, policy(3), func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
			e.assigned("done", v1alpha1.PhaseSucceeded, p, policy(3))
			e.assigned("elsewhere", v1alpha1.PhaseRunning, other, policy(3))
		},
	})
	e.watch()
	e.barrier("sync") // the reaper is up and has looked at every Run
	e.send(podsource.Event{Type: podsource.PodGone, Pod: p, Reason: "Exited"})

	got := e.waitAll("recovery", []string{"retried", "scheduled", "ready", "failed", "cancelling"},
		func(_ store.EventType, r *v1alpha1.Run) bool { return r.Status.Reason != "" })
	for _, name := range []string{"retried", "scheduled", "ready"} {
		st := got[name].Status
		if st.Phase != v1alpha1.PhasePending || st.Attempt != 2 || st.AssignedPod != "" || st.AssignedPodUID != "" ||
			st.Reason != string(retry.PodGone) || st.StartTime != nil {
			t.Errorf("%s: status %+v, want Pending attempt 2 unassigned", name, st)
		}
		if _, waiting := retry.NotBefore(got[name]); !waiting {
			t.Errorf("%s does not wait for its retry", name)
		}
	}
	if st := got["failed"].Status; st.Phase != v1alpha1.PhaseFailed || st.Reason != string(retry.PodGone) || st.CompletionTime == nil || st.Attempt != 1 {
		t.Errorf("failed: status %+v", st)
	}
	if st := got["cancelling"].Status; st.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("cancelling: status %+v", st)
	}
	// Untouched: the terminal one and the one on a live pod.
	for _, name := range []string{"done", "elsewhere"} {
		r, err := e.runs.Get(e.ctx, "", name)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Reason != "" || r.Status.Attempt != 1 {
			t.Errorf("%s was changed: %+v", name, r.Status)
		}
	}
}

// racingRuns makes another writer change a Run right before the reaper's
// first status write of it, so that the write conflicts.
type racingRuns struct {
	store.Resource[*v1alpha1.Run]
	mu    sync.Mutex
	races map[string]func(*v1alpha1.Run) // by name; run once
	wrote []string
}

func (r *racingRuns) UpdateStatus(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	r.mu.Lock()
	race := r.races[run.Name]
	delete(r.races, run.Name)
	r.wrote = append(r.wrote, run.Name)
	r.mu.Unlock()
	if race != nil {
		cur, err := r.Resource.Get(ctx, run.Namespace, run.Name)
		if err != nil {
			return nil, err
		}
		race(cur)
		fresh, err := r.Resource.Update(ctx, cur)
		if err != nil {
			return nil, err
		}
		fresh.Status = cur.Status
		if _, err := r.Resource.UpdateStatus(ctx, fresh); err != nil {
			return nil, err
		}
	}
	return r.Resource.UpdateStatus(ctx, run)
}

// TestConflicts: when the reaper's write conflicts it re-reads the Run; a
// Run another component finished meanwhile keeps its terminal status, and
// one that only changed otherwise is still recovered.
func TestConflicts(t *testing.T) {
	p := pod("a")
	racing := &racingRuns{races: map[string]func(*v1alpha1.Run){
		// runtimed finished it just before the reaper's write.
		"finished": func(r *v1alpha1.Run) { r.Status.Phase = v1alpha1.PhaseSucceeded },
		// a user labelled it.
		"labelled": func(r *v1alpha1.Run) { r.Labels = map[string]string{"x": "y"} },
	}}
	e := newEnv(t, envOptions{
		live: []podsource.Pod{p},
		wrap: func(res store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			racing.Resource = res
			return racing
		},
		before: func(e *env) {
			e.assigned("finished", v1alpha1.PhaseRunning, p, policy(3))
			e.assigned("labelled", v1alpha1.PhaseRunning, p, policy(3))
		},
	})
	e.watch()
	e.barrier("sync")
	e.send(podsource.Event{Type: podsource.PodGone, Pod: p, Reason: "Exited"})
	r := e.waitFor("labelled recovered", func(_ store.EventType, r *v1alpha1.Run) bool {
		return r.Name == "labelled" && r.Status.Phase == v1alpha1.PhasePending
	})
	if r.Status.Attempt != 2 || r.Labels["x"] != "y" {
		t.Errorf("labelled: %+v %v", r.Status, r.Labels)
	}
	e.barrier("sync2")
	f, err := e.runs.Get(e.ctx, "", "finished")
	if err != nil {
		t.Fatal(err)
	}
	if f.Status.Phase != v1alpha1.PhaseSucceeded || f.Status.Reason != "" {
		t.Errorf("finished was overwritten: %+v", f.Status)
	}
	racing.mu.Lock()
	defer racing.mu.Unlock()
	if len(racing.races) != 0 {
		t.Errorf("races not run: %v", racing.races)
	}
}

// TestSweepUnknownPods: Runs assigned to pods the reaper never heard of
// (the process restarted) are recovered after the grace period; Runs on
// live pods are not.
func TestSweepUnknownPods(t *testing.T) {
	live := pod("live")
	ghost := pod("ghost")
	e := newEnv(t, envOptions{
		live: []podsource.Pod{live}, orphanGrace: 5 * time.Second,
		before: func(e *env) {
			e.assigned("lost-running", v1alpha1.PhaseRunning, ghost, policy(3))
			e.assigned("lost-scheduled", v1alpha1.PhaseScheduled, ghost)
			e.assigned("fine", v1alpha1.PhaseRunning, live, policy(3))
		},
	})
	e.watch()
	e.barrier("sync") // the start sweep has run
	if r, _ := e.runs.Get(e.ctx, "", "lost-running"); r.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("recovered before the grace period: %+v", r.Status)
	}
	// A Run assigned to the ghost later (the scheduler raced a restart)
	// gets its own grace period from when it is seen.
	e.clk.Step(3 * time.Second)
	e.assigned("late", v1alpha1.PhaseScheduled, ghost, policy(3))
	e.barrier("sync2")

	e.clk.Step(2 * time.Second)
	got := e.waitAll("sweep", []string{"lost-running", "lost-scheduled"},
		func(_ store.EventType, r *v1alpha1.Run) bool { return r.Status.Reason == string(retry.PodGone) })
	if st := got["lost-running"].Status; st.Phase != v1alpha1.PhasePending || st.Attempt != 2 || st.AssignedPodUID != "" {
		t.Errorf("lost-running: %+v", st)
	}
	if st := got["lost-scheduled"].Status; st.Phase != v1alpha1.PhaseFailed {
		t.Errorf("lost-scheduled: %+v", st)
	}
	if r, _ := e.runs.Get(e.ctx, "", "late"); r.Status.Phase != v1alpha1.PhaseScheduled {
		t.Errorf("late recovered before its grace period: %+v", r.Status)
	}
	e.clk.Step(3 * time.Second)
	e.waitFor("late", func(_ store.EventType, r *v1alpha1.Run) bool {
		return r.Name == "late" && r.Status.Phase == v1alpha1.PhasePending && r.Status.Attempt == 2
	})
	if r, _ := e.runs.Get(e.ctx, "", "fine"); r.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("fine: %+v", r.Status)
	}
}

func TestDeletingRunOnGonePodLosesFinalizer(t *testing.T) {
	p := pod("a")
	e := newEnv(t, envOptions{live: []podsource.Pod{p}})
	e.watch()
	e.assigned("r", v1alpha1.PhaseRunning, p, func(r *v1alpha1.Run) { r.Finalizers = []string{reaper.RuntimedFinalizer, "example.com/keep"} })
	e.assigned("live", v1alpha1.PhaseRunning, p, func(r *v1alpha1.Run) { r.Finalizers = []string{reaper.RuntimedFinalizer} })
	if err := e.runs.Delete(e.ctx, "", "r", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.barrier("sync")
	// Pod alive: runtimed's job, the finalizer stays.
	if r, _ := e.runs.Get(e.ctx, "", "r"); !slices.Contains(r.Finalizers, reaper.RuntimedFinalizer) {
		t.Fatal("finalizer removed while the pod is live")
	}
	e.send(podsource.Event{Type: podsource.PodGone, Pod: p, Reason: "Exited"})
	// r loses the finalizer; the other Run, not being deleted, is
	// recovered instead.
	got := e.waitAll("finalizer released, live failed", []string{"r", "live"}, func(_ store.EventType, r *v1alpha1.Run) bool {
		if r.Name == "r" {
			return !slices.Contains(r.Finalizers, reaper.RuntimedFinalizer)
		}
		return r.Status.Phase == v1alpha1.PhaseFailed
	})
	if r := got["r"]; !slices.Equal(r.Finalizers, []string{"example.com/keep"}) {
		t.Errorf("finalizers %v", r.Finalizers)
	}
	// Without other finalizers the deletion completes, and OnDeleted hears
	// of it.
	r2, err := e.runs.Get(e.ctx, "", "r")
	if err != nil {
		t.Fatal(err)
	}
	r2.Finalizers = nil
	if _, err := e.runs.Update(e.ctx, r2); err != nil {
		t.Fatal(err)
	}
	e.waitFor("r deleted", func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == "r" })
	e.barrier("sync2")
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.deleted, "r") {
		t.Errorf("OnDeleted saw %v", e.deleted)
	}
}

// A Function's replica is created with runtimed's finalizer, so a Run
// that no runtimed holds nor will may carry it: one waiting for a pod
// (Pending, assigned or not) and one that ended without a claim lose it
// when deleted, whatever their pod, or their delete would never end. A
// Run a live pod's runtimed holds (Running) or is about to claim
// (Scheduled) keeps it: that runtimed releases it. Before, only Runs
// without a pod or on a gone pod lost it.
func TestDeletingRunNoRuntimedHoldsLosesFinalizer(t *testing.T) {
	p := pod("a")
	e := newEnv(t, envOptions{live: []podsource.Pod{p}})
	e.watch()
	fin := func(r *v1alpha1.Run) { r.Finalizers = []string{reaper.RuntimedFinalizer} }
	e.create("waiting", fin)
	e.assigned("pending-on-live", v1alpha1.PhasePending, p, fin)
	e.assigned("ended-unclaimed", v1alpha1.PhaseFailed, p, fin)
	e.assigned("scheduled", v1alpha1.PhaseScheduled, p, fin)
	e.assigned("running", v1alpha1.PhaseRunning, p, fin)
	e.setStatus("running", func(st *v1alpha1.RunStatus) { st.StartTime = &metav1.Time{Time: t0} })
	e.assigned("ended-claimed", v1alpha1.PhaseRunning, p, fin)
	e.setStatus("ended-claimed", func(st *v1alpha1.RunStatus) {
		st.StartTime, st.Phase = &metav1.Time{Time: t0}, v1alpha1.PhaseSucceeded
	})
	released := []string{"waiting", "pending-on-live", "ended-unclaimed"}
	kept := []string{"scheduled", "running", "ended-claimed"}
	for _, name := range append(slices.Clone(released), kept...) {
		if err := e.runs.Delete(e.ctx, "", name, store.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAll("deletes of Runs no runtimed holds complete", released, func(typ store.EventType, _ *v1alpha1.Run) bool {
		return typ == store.Deleted
	})
	e.barrier("sync")
	for _, name := range kept {
		r, err := e.runs.Get(e.ctx, "", name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Contains(r.Finalizers, reaper.RuntimedFinalizer) {
			t.Errorf("%s (%s, its pod live) lost runtimed's finalizer", name, r.Status.Phase)
		}
	}
}

func TestTTL(t *testing.T) {
	ttl := func(s int32) func(*v1alpha1.Run) {
		return func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = &s }
	}
	finish := func(e *env, name string, mutate ...func(*v1alpha1.Run)) {
		e.create(name, mutate...)
		e.setStatus(name, func(st *v1alpha1.RunStatus) {
			st.Phase = v1alpha1.PhaseSucceeded
			ct := t0
			st.CompletionTime = ptrTime(ct)
		})
	}
	e := newEnv(t, envOptions{before: func(e *env) {
		finish(e, "short", ttl(29))
		finish(e, "long", ttl(30))
		finish(e, "forever")
		e.create("running", ttl(1)) // not finished: stays
	}})
	e.watch()
	e.barrier("sync")

	e.clk.Step(29 * time.Second)
	e.waitFor("short deleted", func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == "short" })
	if !e.exists("long") {
		t.Fatal("long deleted before its TTL")
	}
	e.clk.Step(time.Second)
	e.waitFor("long deleted", func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == "long" })
	e.barrier("sync2")
	for _, name := range []string{"forever", "running"} {
		if !e.exists(name) {
			t.Errorf("%s deleted", name)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	want := map[string]time.Time{"short": t0.Add(29 * time.Second), "long": t0.Add(30 * time.Second)}
	for i, name := range e.deleted {
		if at, ok := want[name]; ok && e.delAt[i].Before(at) {
			t.Errorf("%s deleted at %v, before %v", name, e.delAt[i], at)
		}
		delete(want, name)
	}
	if len(want) > 0 {
		t.Errorf("OnDeleted missed %v (saw %v)", want, e.deleted)
	}
}

// The server's TTL applies to finished Runs that set none; a Run's own
// TTL wins, shorter or longer.
func TestFinishedRunTTL(t *testing.T) {
	ttl := func(s int32) func(*v1alpha1.Run) {
		return func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = &s }
	}
	finish := func(e *env, name string, mutate ...func(*v1alpha1.Run)) {
		e.create(name, mutate...)
		e.setStatus(name, func(st *v1alpha1.RunStatus) {
			st.Phase = v1alpha1.PhaseFailed
			st.CompletionTime = ptrTime(t0)
		})
	}
	e := newEnv(t, envOptions{finishedRunTTL: time.Minute, before: func(e *env) {
		e.watch() // before the reaper starts, which deletes own-short at once
		finish(e, "default")
		finish(e, "own-short", ttl(0))
		finish(e, "own-long", ttl(3600))
		e.create("running") // not finished: stays
	}})
	e.waitFor("own-short deleted at once", func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == "own-short" })
	e.barrier("sync")
	if !e.exists("default") {
		t.Fatal("default deleted before the server's TTL")
	}
	e.clk.Step(time.Minute)
	e.waitFor("default deleted", func(typ store.EventType, r *v1alpha1.Run) bool { return typ == store.Deleted && r.Name == "default" })
	e.barrier("sync2")
	for _, name := range []string{"own-long", "running"} {
		if !e.exists(name) {
			t.Errorf("%s deleted", name)
		}
	}
}

func ptrTime(t time.Time) *metav1.Time { v := metav1.NewTime(t); return &v }
