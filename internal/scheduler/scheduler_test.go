package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/scheduler"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait; nothing sleeps.
const waitTimeout = 30 * time.Second

// t0 is the fake clock's start, a whole second like stored timestamps.
var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// fakePods is the pool supervisor as plain data: the test sends events.
type fakePods struct {
	snapshot []podsource.Pod
	ch       chan podsource.Event
}

func newFakePods(ready ...podsource.Pod) *fakePods {
	return &fakePods{snapshot: ready, ch: make(chan podsource.Event)}
}

func (f *fakePods) Subscribe() (<-chan podsource.Event, []podsource.Pod, func()) {
	return f.ch, f.snapshot, func() {}
}

func pod(runtime, name string, slots int32) podsource.Pod {
	return podsource.Pod{Namespace: store.DefaultNamespace, Runtime: runtime, Name: name, UID: "uid-" + name, Server: "bash", Slots: slots}
}

// env is a real SQLite store, the two informers, and a scheduler.
type env struct {
	t     testing.TB
	ctx   context.Context
	st    *sqlite.Store
	runs  store.Resource[*v1alpha1.Run]
	pods  *fakePods
	clk   clock.Clock
	track *tracker
	sched *scheduler.Scheduler
}

type envOptions struct {
	clock              clock.Clock
	unschedulableAfter time.Duration
	onScheduled        func(*v1alpha1.Run, time.Duration)
	onUnschedulable    func(*v1alpha1.Run)
	onConflict         func(*v1alpha1.Run)
	// runs wraps the store's status writer the scheduler writes through.
	runs      func(store.StatusWriter[*v1alpha1.Run]) store.StatusWriter[*v1alpha1.Run]
	runtimes  []string // created before the scheduler starts
	ready     []podsource.Pod
	invariant func(state map[string]*v1alpha1.Run, ev store.Event[*v1alpha1.Run]) error
	// before runs against the store before the scheduler starts.
	before func(e *env)
	// noTracker leaves out the test's own watch (benchmarks).
	noTracker bool
	// informerRuns wraps the store the scheduler's Run informer lists
	// and watches.
	informerRuns func(store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run]
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stOpts []sqlite.Option
	if fc, ok := o.clock.(*testingclock.FakeClock); ok {
		stOpts = append(stOpts, sqlite.WithClock(fc.Now))
	}
	st, err := sqlite.Open(ctx, t.TempDir(), stOpts...)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, st: st, runs: st.Runs(), pods: newFakePods(o.ready...), clk: o.clock}
	var writer store.StatusWriter[*v1alpha1.Run] = st.Runs()
	if o.runs != nil {
		writer = o.runs(writer)
	}
	if e.clk == nil {
		e.clk = clock.RealClock{}
	}
	for _, name := range o.runtimes {
		e.createRuntime(name)
	}
	if !o.noTracker {
		e.track = newTracker(t, st.Runs(), o.invariant)
	}
	if o.before != nil {
		o.before(e)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var infRuns store.Resource[*v1alpha1.Run] = st.Runs()
	if o.informerRuns != nil {
		infRuns = o.informerRuns(infRuns)
	}
	runInf := informer.New(infRuns, informer.Options{Logger: log})
	rtInf := informer.New(st.Runtimes(), informer.Options{Logger: log})
	s, err := scheduler.New(scheduler.Config{
		Runs: writer, RunInformer: runInf, Runtimes: st.Runtimes(), RuntimeInformer: rtInf,
		Pods: e.pods, Clock: o.clock, Logger: log, OnScheduled: o.onScheduled,
		OnUnschedulable: o.onUnschedulable, OnConflict: o.onConflict,
		UnschedulableAfter: o.unschedulableAfter,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sched = s
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, run := range []func(context.Context) error{runInf.Run, rtInf.Run, s.Run} {
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
		if e.track != nil {
			e.track.stop()
		}
		st.Close()
	})
	return e
}

func (e *env) createRuntime(name string) {
	e.t.Helper()
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 2, Runs: 8}}
	rt.Name = name
	if _, err := e.st.Runtimes().Create(e.ctx, rt); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) create(name, runtime string, mutate ...func(*v1alpha1.Run)) *v1alpha1.Run {
	e.t.Helper()
	r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: runtime, Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
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

// setStatus writes a status on top of the stored Run.
func (e *env) setStatus(name string, mutate func(*v1alpha1.RunStatus)) *v1alpha1.Run {
	e.t.Helper()
	var got *v1alpha1.Run
	err := store.RetryOnConflict(func() error {
		r, err := e.runs.Get(e.ctx, "", name)
		if err != nil {
			return err
		}
		mutate(&r.Status)
		got, err = e.runs.UpdateStatus(e.ctx, r)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func (e *env) send(ev podsource.Event) {
	e.t.Helper()
	select {
	case e.pods.ch <- ev:
	case <-time.After(waitTimeout):
		e.t.Fatal("the scheduler does not take pod events")
	}
}

// --- tracker: a store watch that mirrors every Run, for waiting and for
// checking invariants on every event.

type tracker struct {
	t         testing.TB
	w         store.Watcher[*v1alpha1.Run]
	done      chan struct{}
	mu        sync.Mutex
	state     map[string]*v1alpha1.Run
	writes    map[string]int // status-changing events per Run
	changed   chan struct{}
	invariant func(map[string]*v1alpha1.Run, store.Event[*v1alpha1.Run]) error
	err       error
}

func newTracker(t testing.TB, runs store.Resource[*v1alpha1.Run], inv func(map[string]*v1alpha1.Run, store.Event[*v1alpha1.Run]) error) *tracker {
	items, rv, err := runs.List(context.Background(), store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := runs.Watch(context.Background(), store.WatchOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	tr := &tracker{t: t, w: w, done: make(chan struct{}), state: map[string]*v1alpha1.Run{}, writes: map[string]int{},
		changed: make(chan struct{}, 1), invariant: inv}
	for _, it := range items {
		tr.state[it.Name] = it
	}
	go tr.loop()
	return tr
}

func (tr *tracker) loop() {
	defer close(tr.done)
	for ev := range tr.w.Events() {
		tr.mu.Lock()
		switch ev.Type {
		case store.Error:
			tr.err = ev.Err
		case store.Deleted:
			delete(tr.state, ev.Object.Name)
		default:
			tr.writes[ev.Object.Name]++
			tr.state[ev.Object.Name] = ev.Object
		}
		if tr.err == nil && tr.invariant != nil {
			if err := tr.invariant(tr.state, ev); err != nil {
				tr.err = err
			}
		}
		tr.mu.Unlock()
		select {
		case tr.changed <- struct{}{}:
		default:
		}
	}
}

func (tr *tracker) stop() {
	tr.w.Stop()
	<-tr.done
}

// waitFor waits until cond holds for the mirrored Runs.
func (tr *tracker) waitFor(what string, cond func(map[string]*v1alpha1.Run) bool) {
	tr.t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		tr.mu.Lock()
		ok, err := cond(tr.state), tr.err
		tr.mu.Unlock()
		if err != nil {
			tr.t.Fatalf("while waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-tr.changed:
		case <-deadline.C:
			tr.mu.Lock()
			defer tr.mu.Unlock()
			tr.t.Fatalf("timed out waiting for %s; runs: %s", what, describe(tr.state))
		}
	}
}

func (tr *tracker) get(name string) *v1alpha1.Run {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.state[name]
}

func (tr *tracker) writesOf(name string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.writes[name]
}

func (tr *tracker) check() {
	tr.t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.err != nil {
		tr.t.Fatal(tr.err)
	}
}

// describe lists the Runs that are not terminal (at most 20), and counts
// the rest.
func describe(state map[string]*v1alpha1.Run) string {
	s := ""
	n, terminal := 0, 0
	for name, r := range state {
		if r.Status.Phase.Terminal() {
			terminal++
			continue
		}
		if n++; n <= 20 {
			s += fmt.Sprintf(" %s=%q/%s/%s@%s", name, r.Status.Phase, r.Status.AssignedPod, r.Status.Reason, r.ResourceVersion)
		}
	}
	return fmt.Sprintf("%d not terminal:%s; %d terminal", n, s, terminal)
}

func phaseIs(name string, p v1alpha1.Phase) func(map[string]*v1alpha1.Run) bool {
	return func(st map[string]*v1alpha1.Run) bool { r := st[name]; return r != nil && r.Status.Phase == p }
}

func isConflict(err error) bool {
	return errors.Is(err, errdefs.ErrConflict)
}

// slotsUsed counts Runs holding a slot per pod UID.
func slotsUsed(state map[string]*v1alpha1.Run) map[string]int {
	used := map[string]int{}
	for _, r := range state {
		if r.Status.Phase.HoldsSlot() {
			used[r.Status.AssignedPodUID]++
		}
	}
	return used
}

// --- tests

func TestAssignRespectsCapacityAndLeastLoaded(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	a, b := pod("bash", "a", 3), pod("bash", "b", 3)
	latencies := make(chan string, 16)
	e := newEnv(t, envOptions{
		clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{a, b}, unschedulableAfter: -1,
		onScheduled: func(r *v1alpha1.Run, d time.Duration) { latencies <- r.Name },
		before: func(e *env) {
			// One Run already runs on a.
			e.create("r0", "bash")
			e.setStatus("r0", func(st *v1alpha1.RunStatus) {
				st.Phase, st.AssignedPod, st.AssignedPodUID, st.Attempt = v1alpha1.PhaseRunning, a.Name, a.UID, 1
			})
		},
	})

	// Each new Run goes to a least-loaded pod.
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("r%d", i)
		before := slotsUsedNow(e)
		e.create(name, "bash")
		e.track.waitFor(name+" scheduled", phaseIs(name, v1alpha1.PhaseScheduled))
		r := e.track.get(name)
		minUsed := min(before[a.UID], before[b.UID])
		if before[r.Status.AssignedPodUID] != minUsed {
			t.Errorf("%s went to %s with %d used; loads before %v", name, r.Status.AssignedPod, before[r.Status.AssignedPodUID], before)
		}
		if r.Status.Attempt != 1 || r.Status.AssignedPod == "" {
			t.Errorf("%s status %+v", name, r.Status)
		}
		c := meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s Scheduled condition %+v", name, c)
		}
		select {
		case got := <-latencies:
			if got != name {
				t.Errorf("latency observed for %s, want %s", got, name)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("no latency observed for %s", name)
		}
	}
	if used := slotsUsedNow(e); used[a.UID] != 3 || used[b.UID] != 3 {
		t.Fatalf("loads %v, want both full", used)
	}

	// Full: two more wait, Unschedulable, written once.
	e.create("r6", "bash")
	e.track.waitFor("r6 unschedulable", func(st map[string]*v1alpha1.Run) bool {
		r := st["r6"]
		if r == nil || r.Status.Phase != v1alpha1.PhasePending {
			return false
		}
		c := meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == scheduler.ReasonUnschedulable
	})
	e.create("r7", "bash")
	e.track.waitFor("r7 unschedulable", phaseIs("r7", v1alpha1.PhasePending))
	// Unrelated events do not rewrite the condition: a label change, a pod
	// of another runtime.
	r6 := e.track.get("r6")
	r6 = r6.DeepCopy()
	r6.Labels = map[string]string{"touched": "yes"}
	if _, err := e.runs.Update(e.ctx, r6); err != nil {
		t.Fatal(err)
	}
	e.send(podsource.Event{Type: podsource.PodReady, Pod: pod("python", "p", 1)})
	e.track.waitFor("r6 touched", func(st map[string]*v1alpha1.Run) bool { return st["r6"].Labels["touched"] == "yes" })

	// Freeing a slot on a wakes the oldest waiting Run at once (no clock
	// step), and it goes to a.
	e.setStatus("r0", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r6 scheduled", phaseIs("r6", v1alpha1.PhaseScheduled))
	if got := e.track.get("r6").Status.AssignedPodUID; got != a.UID {
		t.Errorf("r6 went to %s, want the freed pod a", got)
	}
	if e.track.get("r7").Status.Phase != v1alpha1.PhasePending {
		t.Error("r7 scheduled although no slot was free")
	}
	// r6: created, Unschedulable, label, Scheduled.
	if n := e.track.writesOf("r6"); n != 4 {
		t.Errorf("r6 was written %d times, want 4 (create, unschedulable, label, scheduled)", n)
	}

	// A new pod takes r7 at once.
	e.send(podsource.Event{Type: podsource.PodReady, Pod: pod("bash", "c", 1)})
	e.track.waitFor("r7 scheduled", phaseIs("r7", v1alpha1.PhaseScheduled))
	if got := e.track.get("r7").Status.AssignedPod; got != "c" {
		t.Errorf("r7 went to %s, want c", got)
	}
	e.track.check()
}

func slotsUsedNow(e *env) map[string]int {
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	return slotsUsed(e.track.state)
}

// TestBurstNeverOverAssigns floods two pods of eight slots with 500 Runs,
// with Runs completing and other writers touching Pending Runs (to cause
// conflicts), and checks the capacity on every watch event.
func TestBurstNeverOverAssigns(t *testing.T) {
	a, b := pod("bash", "a", 8), pod("bash", "b", 8)
	slots := map[string]int{a.UID: 8, b.UID: 8}
	e := newEnv(t, envOptions{
		runtimes: []string{"bash"},
		invariant: func(state map[string]*v1alpha1.Run, ev store.Event[*v1alpha1.Run]) error {
			for uid, n := range slotsUsed(state) {
				if n > slots[uid] {
					return fmt.Errorf("pod %s holds %d runs, capacity %d (at resourceVersion %s)", uid, n, slots[uid], ev.Object.ResourceVersion)
				}
			}
			return nil
		},
	})
	const total = 500
	// Half are waiting before any pod is ready.
	create := func(from, to int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + w; i < to; i += 4 {
					r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{}}}}
					r.Name = fmt.Sprintf("run-%03d", i)
					if _, err := e.runs.Create(e.ctx, r); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	create(0, total/2)

	// The completer finishes Scheduled Runs; the meddler touches Pending
	// ones.
	done := make(chan struct{})
	var helpers sync.WaitGroup
	for _, helper := range []func(*env, store.Watcher[*v1alpha1.Run], <-chan struct{}){complete, meddle} {
		// Watching from now, before any pod is ready.
		w, err := e.runs.Watch(e.ctx, store.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		helpers.Add(1)
		go func() {
			defer helpers.Done()
			defer w.Stop()
			helper(e, w, done)
		}()
	}
	defer func() {
		close(done)
		helpers.Wait()
	}()

	e.send(podsource.Event{Type: podsource.PodReady, Pod: a})
	e.send(podsource.Event{Type: podsource.PodReady, Pod: b})
	create(total/2, total)
	e.track.waitFor("all succeeded", func(st map[string]*v1alpha1.Run) bool {
		n := 0
		for _, r := range st {
			if r.Status.Phase == v1alpha1.PhaseSucceeded {
				n++
			}
		}
		return n == total
	})
	e.track.check()
}

// complete moves Scheduled Runs to Running and then Succeeded, as
// runtimed would, until done.
func complete(e *env, w store.Watcher[*v1alpha1.Run], done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case ev, ok := <-w.Events():
			if !ok {
				return
			}
			if ev.Type == store.Error {
				e.t.Errorf("completer watch: %v", ev.Err)
				return
			}
			r := ev.Object
			var next v1alpha1.Phase
			switch r.Status.Phase {
			case v1alpha1.PhaseScheduled:
				next = v1alpha1.PhaseRunning
			case v1alpha1.PhaseRunning:
				next = v1alpha1.PhaseSucceeded
			default:
				continue
			}
			if ev.Type == store.Deleted {
				continue
			}
			r.Status.Phase = next
			if _, err := e.runs.UpdateStatus(e.ctx, r); err != nil && !isConflict(err) && e.ctx.Err() == nil {
				e.t.Errorf("complete %s: %v", r.Name, err)
			}
		}
	}
}

// meddle writes labels on Pending Runs, so that some assignments conflict.
func meddle(e *env, w store.Watcher[*v1alpha1.Run], done <-chan struct{}) {
	n := 0
	for {
		select {
		case <-done:
			return
		case ev, ok := <-w.Events():
			if !ok {
				return
			}
			if ev.Type != store.Added {
				continue
			}
			if n++; n%3 != 0 {
				continue
			}
			r := ev.Object
			r.Labels = map[string]string{"meddled": "yes"}
			if _, err := e.runs.Update(e.ctx, r); err != nil && !isConflict(err) && e.ctx.Err() == nil {
				e.t.Errorf("meddle %s: %v", r.Name, err)
			}
		}
	}
}

func TestBackoffNotBefore(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	p := pod("bash", "a", 4)
	backoff := metav1.Duration{Duration: 2 * time.Second}
	e := newEnv(t, envOptions{
		clock: fc, runtimes: []string{"bash"}, unschedulableAfter: time.Hour,
		before: func(e *env) {
			// r1 failed its first attempt at t0 and waits for attempt 2.
			e.create("r1", "bash", func(r *v1alpha1.Run) {
				r.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 3, Backoff: &backoff}
			})
			e.setStatus("r1", func(st *v1alpha1.RunStatus) {
				st.Phase, st.Attempt, st.AssignedPod, st.AssignedPodUID = v1alpha1.PhaseRunning, 1, "old", "uid-old"
			})
			r1, err := e.runs.Get(e.ctx, "", "r1")
			if err != nil {
				t.Fatal(err)
			}
			d := retry.Decide(r1, retry.PodGone, "gone", t0)
			retry.Apply(r1, d)
			if _, err := e.runs.UpdateStatus(e.ctx, r1); err != nil {
				t.Fatal(err)
			}
			if !d.Retry || !d.NotBefore.Equal(t0.Add(2*time.Second)) {
				t.Fatalf("decision %+v", d)
			}
		},
	})
	e.send(podsource.Event{Type: podsource.PodReady, Pod: p})
	// r2 is scheduled at once; by then r1 has been decided.
	e.create("r2", "bash")
	e.track.waitFor("r2 scheduled", phaseIs("r2", v1alpha1.PhaseScheduled))
	if ph := e.track.get("r1").Status.Phase; ph != v1alpha1.PhasePending {
		t.Fatalf("r1 is %s before its backoff ended", ph)
	}
	fc.Step(1999 * time.Millisecond)
	e.create("r3", "bash")
	e.track.waitFor("r3 scheduled", phaseIs("r3", v1alpha1.PhaseScheduled))
	if ph := e.track.get("r1").Status.Phase; ph != v1alpha1.PhasePending {
		t.Fatalf("r1 is %s before its backoff ended", ph)
	}
	fc.Step(time.Millisecond)
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	r1 := e.track.get("r1")
	if r1.Status.Attempt != 2 || r1.Status.AssignedPodUID != p.UID {
		t.Errorf("r1 status %+v", r1.Status)
	}
	if c := meta.FindStatusCondition(r1.Status.Conditions, retry.ConditionRetrying); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Retrying condition %+v, want False", c)
	}
	if _, waiting := retry.NotBefore(r1); waiting {
		t.Error("r1 still waits for a retry")
	}
}

// unschedulable reports whether r says it is unschedulable.
func unschedulable(r *v1alpha1.Run) bool {
	if r == nil || r.Status.Phase != v1alpha1.PhasePending {
		return false
	}
	c := meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == scheduler.ReasonUnschedulable
}

func isUnschedulable(name string) func(map[string]*v1alpha1.Run) bool {
	return func(st map[string]*v1alpha1.Run) bool { return unschedulable(st[name]) }
}

// awaitTimer waits until the scheduler has armed its timer on fc, so that
// a step of fc fires it. The fake clock has no event for that, so this
// polls; the scheduler is the only user of fc's timers.
func awaitTimer(t *testing.T, fc *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the scheduler armed no timer")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnschedulableNoReadyPod: a Run of a Runtime with no ready pod is
// marked after the delay, not before.
func TestUnschedulableNoReadyPod(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, unschedulableAfter: 3 * time.Second})
	e.create("r1", "bash")
	// A barrier: a cancelled Run is handled after r1 was decided.
	e.create("barrier", "bash", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	e.track.waitFor("barrier cancelled", phaseIs("barrier", v1alpha1.PhaseCancelled))
	if r1 := e.track.get("r1"); r1.Status.Phase != "" {
		t.Fatalf("r1 written before the delay: %+v", r1.Status)
	}
	awaitTimer(t, fc)
	fc.Step(3 * time.Second)
	e.track.waitFor("r1 unschedulable", isUnschedulable("r1"))
	c := meta.FindStatusCondition(e.track.get("r1").Status.Conditions, scheduler.ConditionScheduled)
	if want := "runtime bash has no ready pod"; c.Message != want {
		t.Errorf("message %q, want %q", c.Message, want)
	}
}

// TestDrainingPoolWritesNoUnschedulable: Runs queued behind others in a
// pool that keeps handing out slots wait longer than UnschedulableAfter,
// and none is marked unschedulable.
func TestDrainingPoolWritesNoUnschedulable(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	e := newEnv(t, envOptions{
		clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{pod("bash", "a", 1)}, unschedulableAfter: 3 * time.Second,
		invariant: func(state map[string]*v1alpha1.Run, ev store.Event[*v1alpha1.Run]) error {
			if unschedulable(ev.Object) {
				return fmt.Errorf("%s marked unschedulable in a draining pool at %v", ev.Object.Name, fc.Now())
			}
			return nil
		},
	})
	const n = 5
	for i := 1; i <= n; i++ {
		e.create(fmt.Sprintf("r%d", i), "bash")
	}
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	// One slot, freed every 2 s: from the second step on, the Runs still
	// queued have waited 4 s and more, longer than UnschedulableAfter,
	// but the pool handed out a slot 2 s ago.
	for i := 1; i < n; i++ {
		fc.Step(2 * time.Second)
		e.setStatus(fmt.Sprintf("r%d", i), func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
		next := fmt.Sprintf("r%d", i+1)
		e.track.waitFor(next+" scheduled", phaseIs(next, v1alpha1.PhaseScheduled))
	}
	// An Unschedulable write of a Run is made before its assignment (the
	// Run is not decided while its write is in flight), so the tracker
	// has seen every such write by now; the invariant failed on any.
	e.track.check()
	for i := 2; i <= n; i++ {
		// created, Scheduled, Succeeded (the last one is not finished).
		want := 3
		if i == n {
			want = 2
		}
		if name := fmt.Sprintf("r%d", i); e.track.writesOf(name) != want {
			t.Errorf("%s was written %d times, want %d (create, scheduled, succeeded)", name, e.track.writesOf(name), want)
		}
	}
}

// TestStuckPoolWritesUnschedulable: a full pod with nothing finishing gets
// its waiting Runs marked once each after the delay; after it drained for
// a while and gets stuck again, a Run that waits then is marked too, when
// the pool has handed out nothing for the delay.
func TestStuckPoolWritesUnschedulable(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	e := newEnv(t, envOptions{clock: fc, runtimes: []string{"bash"}, ready: []podsource.Pod{pod("bash", "a", 1)}, unschedulableAfter: 3 * time.Second})
	e.create("r1", "bash")
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	// More than the Unschedulable writes the scheduler makes at once.
	queued := []string{"r2", "r3", "x1", "x2", "x3", "x4", "x5", "x6"}
	for _, name := range queued {
		e.create(name, "bash")
	}
	e.create("barrier", "bash", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	e.track.waitFor("barrier cancelled", phaseIs("barrier", v1alpha1.PhaseCancelled))
	awaitTimer(t, fc)
	fc.Step(3 * time.Second) // t0+3s: r1 holds the slot since t0
	e.track.waitFor("every queued Run unschedulable", func(st map[string]*v1alpha1.Run) bool {
		for _, name := range queued {
			if !unschedulable(st[name]) {
				return false
			}
		}
		return true
	})
	c := meta.FindStatusCondition(e.track.get("r2").Status.Conditions, scheduler.ConditionScheduled)
	if want := "all 1 ready pods of runtime bash are full and none has freed a slot for 3s"; c.Message != want {
		t.Errorf("message %q, want %q", c.Message, want)
	}

	// The pool drains for a while: r2 at t0+3s, r3 at t0+5s.
	e.setStatus("r1", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r2 scheduled", phaseIs("r2", v1alpha1.PhaseScheduled))
	e.create("r4", "bash") // waits from t0+3s
	e.create("barrier2", "bash", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	e.track.waitFor("barrier2 cancelled", phaseIs("barrier2", v1alpha1.PhaseCancelled))
	awaitTimer(t, fc)
	fc.Step(2 * time.Second)
	e.setStatus("r2", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r3 scheduled", phaseIs("r3", v1alpha1.PhaseScheduled))
	// t0+6s: r4 has waited 3 s, but the pool handed a slot 1 s ago; it is
	// stuck from t0+8s. r3 holds the slot from then on.
	awaitTimer(t, fc)
	fc.Step(time.Second)
	awaitTimer(t, fc) // the pool's check, armed by r4's timer
	if unschedulable(e.track.get("r4")) {
		t.Fatal("r4 marked unschedulable while the pool drained")
	}
	fc.Step(2 * time.Second)
	e.track.waitFor("r4 unschedulable", isUnschedulable("r4"))

	// Each was marked once: created, Unschedulable, then Scheduled and
	// Succeeded as far as each got.
	for name, want := range map[string]int{"r2": 4, "r3": 3, "r4": 2} {
		if got := e.track.writesOf(name); got != want {
			t.Errorf("%s was written %d times, want %d", name, got, want)
		}
	}
	e.track.check()
}

func TestCancelPending(t *testing.T) {
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, unschedulableAfter: -1})
	// No pod: the Run waits.
	e.create("r1", "bash")
	e.track.waitFor("r1 pending", phaseIs("r1", v1alpha1.PhasePending))
	r1 := e.track.get("r1").DeepCopy()
	r1.Spec.CancelRequested = true
	if _, err := e.runs.Update(e.ctx, r1); err != nil {
		t.Fatal(err)
	}
	// Cancelled at creation.
	e.create("r2", "bash", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	for _, name := range []string{"r1", "r2"} {
		e.track.waitFor(name+" cancelled", phaseIs(name, v1alpha1.PhaseCancelled))
		st := e.track.get(name).Status
		if st.Reason != string(retry.Cancelled) || st.CompletionTime == nil || st.AssignedPod != "" {
			t.Errorf("%s status %+v", name, st)
		}
	}
	// A pod arriving later does not take them.
	e.send(podsource.Event{Type: podsource.PodReady, Pod: pod("bash", "a", 2)})
	e.create("r3", "bash")
	e.track.waitFor("r3 scheduled", phaseIs("r3", v1alpha1.PhaseScheduled))
	for _, name := range []string{"r1", "r2"} {
		if ph := e.track.get(name).Status.Phase; ph != v1alpha1.PhaseCancelled {
			t.Errorf("%s is %s", name, ph)
		}
	}
}

// TestHeld: a held Run takes no free slot, says why once, and is scheduled
// once its hold is cleared; cancelling a held Run ends it.
func TestHeld(t *testing.T) {
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{pod("bash", "a", 2)}})
	held := func(r *v1alpha1.Run) { r.Spec.Held = true }
	e.create("h1", "bash", held)
	e.create("h2", "bash", held)
	for _, name := range []string{"h1", "h2"} {
		e.track.waitFor(name+" held", func(st map[string]*v1alpha1.Run) bool {
			r := st[name]
			if r == nil || r.Status.Phase != v1alpha1.PhasePending {
				return false
			}
			c := meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == scheduler.ReasonHeld
		})
	}
	// A Run created after them takes a slot they left free.
	e.create("r1", "bash")
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	if got := e.track.get("h1").Status; got.Phase != v1alpha1.PhasePending || got.AssignedPod != "" {
		t.Fatalf("h1 is held yet %s on %q", got.Phase, got.AssignedPod)
	}
	h1 := e.track.get("h1").DeepCopy()
	h1.Spec.Held = false
	if _, err := e.runs.Update(e.ctx, h1); err != nil {
		t.Fatal(err)
	}
	e.track.waitFor("h1 scheduled", phaseIs("h1", v1alpha1.PhaseScheduled))
	h2 := e.track.get("h2").DeepCopy()
	h2.Spec.CancelRequested = true
	if _, err := e.runs.Update(e.ctx, h2); err != nil {
		t.Fatal(err)
	}
	e.track.waitFor("h2 cancelled", phaseIs("h2", v1alpha1.PhaseCancelled))
	if n := e.track.writesOf("h1"); n != 4 {
		t.Errorf("h1 had %d writes, want 4 (created, held once, released, scheduled)", n)
	}
	e.track.check()
}

func TestUnknownRuntime(t *testing.T) {
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{pod("bash", "a", 2)}})
	e.create("r1", "nope")
	e.track.waitFor("r1 failed", phaseIs("r1", v1alpha1.PhaseFailed))
	st := e.track.get("r1").Status
	if st.Reason != string(scheduler.RuntimeNotFound) || st.CompletionTime == nil || st.Message == "" {
		t.Errorf("status %+v", st)
	}
	// A Runtime of the same name in another namespace does not count.
	other := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{}}}}
	other.Name, other.Namespace = "r2", "elsewhere"
	if _, err := e.runs.Create(e.ctx, other); err != nil {
		t.Fatal(err)
	}
	e.track.waitFor("r2 failed", phaseIs("r2", v1alpha1.PhaseFailed))
}

func TestRuntimeDeletedFailsWaitingRuns(t *testing.T) {
	p := pod("bash", "a", 1)
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{p}, unschedulableAfter: -1})
	e.create("r1", "bash")
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	e.create("r2", "bash")
	e.track.waitFor("r2 pending", phaseIs("r2", v1alpha1.PhasePending))
	if err := e.st.Runtimes().Delete(e.ctx, "", "bash", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.send(podsource.Event{Type: podsource.PodGone, Pod: p, Reason: "RuntimeDeleted"})
	e.track.waitFor("r2 failed", phaseIs("r2", v1alpha1.PhaseFailed))
	if got := e.track.get("r2").Status.Reason; got != string(scheduler.RuntimeNotFound) {
		t.Errorf("reason %q", got)
	}
}

func TestPodGoneFreesNothingButStopsAssignments(t *testing.T) {
	a, b := pod("bash", "a", 1), pod("bash", "b", 1)
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{a}, unschedulableAfter: -1})
	e.create("r1", "bash")
	e.track.waitFor("r1 scheduled", phaseIs("r1", v1alpha1.PhaseScheduled))
	e.send(podsource.Event{Type: podsource.PodGone, Pod: a, Reason: "Exited"})
	// The reaper would now retry r1; here it stays, and a new Run waits
	// for a new pod.
	e.create("r2", "bash")
	e.track.waitFor("r2 pending", phaseIs("r2", v1alpha1.PhasePending))
	e.send(podsource.Event{Type: podsource.PodReady, Pod: b})
	e.track.waitFor("r2 scheduled", phaseIs("r2", v1alpha1.PhaseScheduled))
	if got := e.track.get("r2").Status.AssignedPod; got != "b" {
		t.Errorf("r2 went to %s", got)
	}
}

// writeFunc is a store.StatusWriter from a function.
type writeFunc func(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error)

func (f writeFunc) UpdateStatus(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	return f(ctx, run)
}

// TestMetricsHooks: the queue depth follows the waiting Runs, each stored
// Unschedulable condition is reported once, and an assignment the store
// refuses because another writer changed the Run meanwhile is reported as
// a conflict (made real here: a label write lands between the decision and
// the assignment's write).
func TestMetricsHooks(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	a := pod("bash", "a", 1)
	var unsched, conflicts atomic.Int32
	var meddled atomic.Bool
	var e *env
	e = newEnv(t, envOptions{
		clock: fc, runtimes: []string{"bash"}, unschedulableAfter: -1,
		onUnschedulable: func(*v1alpha1.Run) { unsched.Add(1) },
		onConflict:      func(*v1alpha1.Run) { conflicts.Add(1) },
		runs: func(w store.StatusWriter[*v1alpha1.Run]) store.StatusWriter[*v1alpha1.Run] {
			return writeFunc(func(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
				if run.Name == "r1" && run.Status.Phase == v1alpha1.PhaseScheduled && meddled.CompareAndSwap(false, true) {
					other, err := e.runs.Get(ctx, "", "r1")
					if err != nil {
						return nil, err
					}
					other.Labels = map[string]string{"touched": "yes"}
					if _, err := e.runs.Update(ctx, other); err != nil {
						return nil, err
					}
				}
				return w.UpdateStatus(ctx, run)
			})
		},
	})
	// No pod: both wait and are marked Unschedulable once each.
	e.create("r1", "bash")
	e.create("r2", "bash")
	e.track.waitFor("both unschedulable", func(st map[string]*v1alpha1.Run) bool {
		return isUnschedulable("r1")(st) && isUnschedulable("r2")(st)
	})
	waitUntil(t, "two waiting", func() bool { return e.sched.Waiting() == 2 })
	if n := unsched.Load(); n != 2 {
		t.Errorf("%d Unschedulable writes reported, want 2", n)
	}
	// A pod of one slot: r1 (the oldest) is decided first; its first
	// assignment conflicts with the label write. The slot then goes to r1
	// from its newer version or to r2, whichever the scheduler decides
	// first (the label write voids r1's reservation as soon as the
	// informer shows it, before the write's result is in).
	e.send(podsource.Event{Type: podsource.PodReady, Pod: a})
	var first, second string
	e.track.waitFor("one scheduled", func(st map[string]*v1alpha1.Run) bool {
		switch {
		case phaseIs("r1", v1alpha1.PhaseScheduled)(st):
			first, second = "r1", "r2"
		case phaseIs("r2", v1alpha1.PhaseScheduled)(st):
			first, second = "r2", "r1"
		default:
			return false
		}
		return true
	})
	// r1's write may still be in flight: once the label write reached the
	// informer, the reservation it was made on is void and the slot free.
	waitUntil(t, "the conflict reported", func() bool { return conflicts.Load() >= 1 })
	waitUntil(t, "one waiting", func() bool { return e.sched.Waiting() == 1 })
	e.setStatus(first, func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor(second+" scheduled", phaseIs(second, v1alpha1.PhaseScheduled))
	waitUntil(t, "none waiting", func() bool { return e.sched.Waiting() == 0 })
	if got := e.track.get("r1").Labels["touched"]; got != "yes" {
		t.Errorf("r1 lost the label written meanwhile: %q", got)
	}
	if n := unsched.Load(); n != 2 {
		t.Errorf("%d Unschedulable writes reported, want still 2", n)
	}
	if n := conflicts.Load(); n != 1 {
		t.Errorf("%d conflicts reported in all, want 1", n)
	}
}

// waitUntil polls cond, which the scheduler's goroutine makes true soon
// after an event the test has seen, until waitTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// heldWatch is a Runs store whose watches start only once release is
// closed (from the version asked for, so nothing is lost): a Run watch
// that lags behind the creates.
type heldWatch struct {
	store.Resource[*v1alpha1.Run]
	release <-chan struct{}
}

func (h heldWatch) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.Resource.Watch(ctx, opts)
}

// A Run the scheduler is told of by Created (the Function controller's
// replica, as its create returned it) is assigned before the Run watch
// delivers it, and counts against its pod's slot as any assignment does:
// a second one waits for the slot. Once the watch delivers them, nothing
// is assigned twice. Before, the assignment waited for the watch.
func TestCreatedIsAssignedBeforeTheWatchDeliversIt(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	a := pod("bash", "a", 1)
	var mu sync.Mutex
	assigned := map[string]int{}
	e := newEnv(t, envOptions{runtimes: []string{"bash"}, ready: []podsource.Pod{a},
		onScheduled: func(r *v1alpha1.Run, _ time.Duration) {
			mu.Lock()
			assigned[r.Name]++
			mu.Unlock()
		},
		informerRuns: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			return heldWatch{Resource: r, release: release}
		}})
	r1 := e.create("r1", "bash")
	e.sched.Created(r1)
	e.track.waitFor("r1 scheduled with the watch held", phaseIs("r1", v1alpha1.PhaseScheduled))
	if got := e.track.get("r1"); got.Status.AssignedPodUID != a.UID {
		t.Fatalf("r1 assigned to %q", got.Status.AssignedPodUID)
	}
	// The one slot is r1's: r2 waits for it.
	r2 := e.create("r2", "bash")
	e.sched.Created(r2)
	open()
	e.track.waitFor("r2 seen", func(m map[string]*v1alpha1.Run) bool { return m["r2"] != nil })
	e.setStatus("r1", func(st *v1alpha1.RunStatus) { st.Phase = v1alpha1.PhaseSucceeded })
	e.track.waitFor("r2 scheduled once r1 ended", phaseIs("r2", v1alpha1.PhaseScheduled))
	// OnScheduled is called once the write has returned, which can be
	// after the tracker's watch saw it.
	waitUntil(t, "r2's OnScheduled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return assigned["r2"] > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if assigned["r1"] != 1 || assigned["r2"] != 1 {
		t.Errorf("assignments %v, want one each", assigned)
	}
}
