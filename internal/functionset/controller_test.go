package functionset_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/reaper"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/validation"
)

var t0 = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

// env runs a Controller over a real SQLite store with a fake clock, beside
// the reaper, which releases runtimed's finalizer (replicas are created
// with it) of a replica deleted that no runtimed holds: here none does.
// What runtimed does to a replica (Ready, Failed) the test writes itself.
type env struct {
	t    *testing.T
	ctx  context.Context
	st   *sqlite.Store
	clk  *testingclock.FakeClock
	runs *informer.Informer[*v1alpha1.Run]
	fns  *informer.Informer[*v1alpha1.Function]
	c    *functionset.Controller

	changed chan struct{}
	// statusWrites counts the controller's writes of Function status.
	statusWrites atomic.Int32
}

// countedFunctions is the store's Functions, counting status writes.
type countedFunctions struct {
	store.Resource[*v1alpha1.Function]
	n *atomic.Int32
}

func (f countedFunctions) UpdateStatus(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	f.n.Add(1)
	return f.Resource.UpdateStatus(ctx, fn)
}

func newEnv(t *testing.T) *env { return newEnvWith(t, nil) }

// newEnvWith is newEnv with a dispatcher's load source and, when given, a
// Created hook.
func newEnvWith(t *testing.T, load func(ns, name string) (int, int), created ...func(*v1alpha1.Run)) *env {
	t.Helper()
	return newEnvConfig(t, func(c *functionset.Config) {
		c.Load = load
		if len(created) > 0 {
			c.Created = created[0]
		}
	})
}

// newEnvConfig is newEnv with the controller's Config changed by edit.
func newEnvConfig(t *testing.T, edit func(*functionset.Config)) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fc := testingclock.NewFakeClock(t0)
	st, err := sqlite.Open(ctx, t.TempDir(), sqlite.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &env{t: t, ctx: ctx, st: st, clk: fc, changed: make(chan struct{}, 1),
		runs: informer.New(st.Runs(), informer.Options{Logger: log}),
		fns:  informer.New(st.Functions(), informer.Options{Logger: log})}
	poke := func() {
		select {
		case e.changed <- struct{}{}:
		default:
		}
	}
	e.runs.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{AddFunc: func(*v1alpha1.Run) { poke() },
		UpdateFunc: func(_, _ *v1alpha1.Run) { poke() }, DeleteFunc: func(*v1alpha1.Run) { poke() }})
	e.fns.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Function]{AddFunc: func(*v1alpha1.Function) { poke() },
		UpdateFunc: func(_, _ *v1alpha1.Function) { poke() }, DeleteFunc: func(*v1alpha1.Function) { poke() }})
	cfg := functionset.Config{Functions: countedFunctions{st.Functions(), &e.statusWrites}, Runs: st.Runs(),
		FunctionInformer: e.fns, RunInformer: e.runs, Clock: fc, Logger: log}
	if edit != nil {
		edit(&cfg)
	}
	c, err := functionset.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	rp, err := reaper.New(reaper.Config{Runs: st.Runs(), RunInformer: e.runs, Pods: noPods{}, Clock: fc, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{e.runs.Run, e.fns.Run, c.Run, rp.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		st.Close()
	})
	return e
}

// noPods is a pod source with no pods: the replicas here are on none.
type noPods struct{}

func (noPods) Subscribe() (<-chan podsource.Event, []podsource.Pod, func()) {
	return make(chan podsource.Event), nil, func() {}
}

// until waits for cond, re-checking it on every change the informers see.
func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-e.changed:
		case <-deadline:
			e.t.Fatalf("waited 20 s for %s; replicas: %s", what, e.describe())
		}
	}
}

// stepUntil moves the fake clock by d, and again by d as long as cond does
// not hold: the controller arms its timer after the writes the test
// waited for, so a single step may come before the timer it should fire.
func (e *env) stepUntil(what string, d time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		e.clk.Step(d)
		select {
		case <-e.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			e.t.Fatalf("waited 20 s for %s; replicas: %s", what, e.describe())
		}
	}
}

func (e *env) replicas() []*v1alpha1.Run {
	out := e.runs.List(func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelFunction] == "hello" })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (e *env) describe() string {
	var b strings.Builder
	for _, r := range e.replicas() {
		b.WriteString(r.Name + "[" + string(r.Status.Phase) + " " + r.Labels[v1alpha1.LabelTemplateHash] + " draining=" + r.Annotations[v1alpha1.AnnotationDraining] + "] ")
	}
	return b.String()
}

// count counts the replicas for which f holds.
func (e *env) count(f func(*v1alpha1.Run) bool) int {
	n := 0
	for _, r := range e.replicas() {
		if f(r) {
			n++
		}
	}
	return n
}

func draining(r *v1alpha1.Run) bool { return r.Annotations[v1alpha1.AnnotationDraining] == "true" }

// setPhase writes what runtimed would.
func (e *env) setPhase(r *v1alpha1.Run, phase v1alpha1.Phase) {
	e.t.Helper()
	err := store.RetryOnConflict(func() error {
		cur, err := e.st.Runs().Get(e.ctx, r.Namespace, r.Name)
		if err != nil {
			return err
		}
		cur.Status.Phase = phase
		if phase.Terminal() {
			cur.Status.Reason, cur.Status.Message = "RegistrationFailed", "ModuleNotFoundError: No module named 'main'"
		}
		_, err = e.st.Runs().UpdateStatus(e.ctx, cur)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) readyAll() {
	e.t.Helper()
	for _, r := range e.replicas() {
		if r.Status.Phase == "" && !draining(r) {
			e.setPhase(r, v1alpha1.PhaseReady)
		}
	}
}

func (e *env) function() *v1alpha1.Function {
	e.t.Helper()
	fn, err := e.st.Functions().Get(e.ctx, "default", "hello")
	if err != nil {
		e.t.Fatal(err)
	}
	return fn
}

func (e *env) updateSpec(mutate func(*v1alpha1.Function)) {
	e.t.Helper()
	err := store.RetryOnConflict(func() error {
		fn := e.function()
		mutate(fn)
		if err := validation.ValidateFunction(fn); err != nil {
			e.t.Fatal(err)
		}
		_, err := e.st.Functions().Update(e.ctx, fn)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func newFunction(min, max int32) *v1alpha1.Function {
	fn := &v1alpha1.Function{}
	fn.Name = "hello"
	fn.Spec = v1alpha1.FunctionSpec{Runtime: "python", Handler: "main.handler",
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.py", Text: "def handler(e, c):\n    return e\n"}},
		Scale:  v1alpha1.FunctionScale{Min: min, Max: max}}
	validation.SetFunctionDefaults(fn)
	return fn
}

func TestMinReplicasAreReadyAndTheirStatusIsTheFunctions(t *testing.T) {
	e := newEnv(t)
	fn, err := e.st.Functions().Create(e.ctx, newFunction(2, 4))
	if err != nil {
		t.Fatal(err)
	}
	e.until("2 replicas", func() bool { return len(e.replicas()) == 2 })
	hash := functionset.TemplateHash(fn)
	for _, r := range e.replicas() {
		if r.Labels[v1alpha1.LabelTemplateHash] != hash || !functionset.OwnedBy(r, string(fn.UID)) {
			t.Fatalf("replica %s: labels %v, owners %v", r.Name, r.Labels, r.OwnerReferences)
		}
		if m := r.Spec.Mode.Function; m == nil || m.Handler != "main.handler" || r.Spec.Runtime != "python" || r.Spec.Source.Inline.Path != "main.py" {
			t.Fatalf("replica %s spec %+v", r.Name, r.Spec)
		}
		// Created with runtimed's finalizer, which runtimed would
		// otherwise write after its claim, in series before Ready.
		if !slices.Equal(r.Finalizers, []string{v1alpha1.FinalizerRuntimed}) {
			t.Fatalf("replica %s finalizers %v, want runtimed's from its create", r.Name, r.Finalizers)
		}
		// Valid but for that finalizer, which only Stoke may set.
		check := r.DeepCopy()
		check.Finalizers = nil
		if err := validation.ValidateRun(check); err != nil {
			t.Fatalf("a replica is not a valid Run: %v", err)
		}
	}
	e.readyAll()
	e.stepUntil("status ready 2", functionset.StatusDelay, func() bool {
		s := e.function().Status
		return s.ReadyReplicas == 2 && s.Replicas == 2 && s.UpdatedReplicas == 2 && s.Selector == "stoke.dev/function=hello" && s.TemplateHash == hash
	})
	// Never more than asked for.
	if n := len(e.replicas()); n != 2 {
		t.Fatalf("%d replicas, want 2", n)
	}
}

func TestADeadReplicaIsReplacedWithBackoff(t *testing.T) {
	e := newEnv(t)
	if _, err := e.st.Functions().Create(e.ctx, newFunction(1, 1)); err != nil {
		t.Fatal(err)
	}
	e.until("1 replica", func() bool { return len(e.replicas()) == 1 })
	first := e.replicas()[0]
	e.setPhase(first, v1alpha1.PhaseFailed)
	e.until("a replacement", func() bool {
		rs := e.replicas()
		return len(rs) == 1 && rs[0].UID != first.UID
	})
	e.stepUntil("the failure in status", functionset.StatusDelay, func() bool {
		fn := e.function()
		for _, c := range fn.Status.Conditions {
			if c.Type == functionset.ConditionReplicaFailure && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, first.Name) && strings.Contains(c.Message, "ModuleNotFoundError") {
				return true
			}
		}
		return false
	})
	// The second death in a row waits a second before its replacement.
	second := e.replicas()[0]
	e.setPhase(second, v1alpha1.PhaseFailed)
	e.until("the dead replica deleted", func() bool {
		return e.count(func(r *v1alpha1.Run) bool { return r.UID == second.UID }) == 0
	})
	if n := len(e.replicas()); n != 0 {
		t.Fatalf("replaced at once after a second death: %s", e.describe())
	}
	e.stepUntil("a replacement after the back-off", time.Second, func() bool { return len(e.replicas()) == 1 })
	// A Ready replica clears the failure.
	e.readyAll()
	e.stepUntil("the failure cleared", functionset.StatusDelay, func() bool {
		for _, c := range e.function().Status.Conditions {
			if c.Type == functionset.ConditionReplicaFailure {
				return c.Status == metav1.ConditionFalse
			}
		}
		return false
	})
}

func TestASpecChangeRolls(t *testing.T) {
	e := newEnv(t)
	if _, err := e.st.Functions().Create(e.ctx, newFunction(2, 4)); err != nil {
		t.Fatal(err)
	}
	e.until("2 replicas", func() bool { return len(e.replicas()) == 2 })
	e.readyAll()
	e.stepUntil("2 ready", functionset.StatusDelay, func() bool { return e.function().Status.ReadyReplicas == 2 })
	oldHash := functionset.TemplateHash(e.function())

	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Env = []v1alpha1.EnvVar{{Name: "V", Value: "2"}} })
	newHash := functionset.TemplateHash(e.function())
	isNew := func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelTemplateHash] == newHash }
	e.until("2 new replicas", func() bool { return e.count(isNew) == 2 })
	// A sync that saw the new replicas has written its marks before its
	// status: until the new ones are Ready, the old ones serve, none
	// draining.
	e.stepUntil("status of the new replicas", functionset.StatusDelay, func() bool {
		s := e.function().Status
		return s.TemplateHash == newHash && s.UpdatedReplicas == 2
	})
	if n := e.count(draining); n != 0 {
		t.Fatalf("old replicas drained before the new ones were Ready: %s", e.describe())
	}
	e.readyAll()
	e.until("the old ones draining", func() bool {
		return e.count(func(r *v1alpha1.Run) bool { return !isNew(r) && draining(r) }) == 2
	})
	if n := e.count(func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelTemplateHash] == oldHash }); n != 2 {
		t.Fatalf("old replicas deleted before their drain time: %s", e.describe())
	}
	e.stepUntil("only the new ones", 2*time.Second, func() bool { return len(e.replicas()) == 2 && e.count(isNew) == 2 })
	e.stepUntil("status updated 2", functionset.StatusDelay, func() bool {
		s := e.function().Status
		return s.UpdatedReplicas == 2 && s.ReadyReplicas == 2 && s.Replicas == 2 && s.TemplateHash == newHash
	})
}

func TestReplicasFollowTheDesiredCountWithinMinAndMax(t *testing.T) {
	e := newEnv(t)
	if _, err := e.st.Functions().Create(e.ctx, newFunction(0, 3)); err != nil {
		t.Fatal(err)
	}
	// min 0: none, until spec.replicas (the scale subresource) asks.
	e.stepUntil("status written", functionset.StatusDelay, func() bool { return e.function().Status.Selector != "" })
	if n := len(e.replicas()); n != 0 {
		t.Fatalf("min 0 made %d replicas", n)
	}
	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Replicas = ptr(int32(5)) })
	e.until("3 replicas (max)", func() bool { return len(e.replicas()) == 3 })
	e.readyAll()
	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Replicas = ptr(int32(1)) })
	e.until("2 draining", func() bool { return e.count(draining) == 2 })
	e.stepUntil("1 replica", 2*time.Second, func() bool { return len(e.replicas()) == 1 })
	// A Run that carries the label without a Function owner is not a
	// replica: neither counted nor deleted.
	stray := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.f"}}}}
	stray.Name, stray.Namespace, stray.Labels = "stray", "default", map[string]string{v1alpha1.LabelFunction: "hello"}
	if _, err := e.st.Runs().Create(e.ctx, stray); err != nil {
		t.Fatal(err)
	}
	// Deleting the Function takes its replicas.
	if err := e.st.Functions().Delete(e.ctx, "default", "hello", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.until("no replicas but the stray Run", func() bool {
		rs := e.replicas()
		return len(rs) == 1 && rs[0].Name == "stray"
	})
}

func ptr[T any](v T) *T { return &v }

// With a load source (stoke up's dispatcher), status.inFlight and
// status.queued follow it: looked at again each LoadRefresh, and back to
// 0 once the load is gone.
func TestStatusCarriesTheDispatchersLoad(t *testing.T) {
	var inFlight, queued atomic.Int32
	inFlight.Store(3)
	queued.Store(5)
	e := newEnvWith(t, func(ns, name string) (int, int) {
		if ns != "default" || name != "hello" {
			return 0, 0
		}
		return int(inFlight.Load()), int(queued.Load())
	})
	if _, err := e.st.Functions().Create(e.ctx, newFunction(0, 2)); err != nil {
		t.Fatal(err)
	}
	e.stepUntil("status 3 in flight, 5 queued", functionset.StatusDelay, func() bool {
		s := e.function().Status
		return s.InFlight == 3 && s.Queued == 5
	})
	queued.Store(1)
	e.stepUntil("status 3 in flight, 1 queued", functionset.LoadRefresh, func() bool {
		s := e.function().Status
		return s.InFlight == 3 && s.Queued == 1
	})
	inFlight.Store(0)
	queued.Store(0)
	e.stepUntil("status 0 and 0", functionset.LoadRefresh, func() bool {
		s := e.function().Status
		return s.InFlight == 0 && s.Queued == 0
	})
}

// A desired count on its way to spec.replicas (Expect: the autoscaler's
// write) is kept at once, within max, without waiting for the write to
// come back through the informer; once the informer shows spec.replicas
// at that count, spec.replicas rules again (a later scale down is not
// held up), and a withdrawn expectation (the write failed) leaves its
// replicas too many, to drain.
func TestAnExpectedCountIsKeptBeforeItsWrite(t *testing.T) {
	e := newEnv(t)
	fn, err := e.st.Functions().Create(e.ctx, newFunction(0, 2))
	if err != nil {
		t.Fatal(err)
	}
	e.stepUntil("status written", functionset.StatusDelay, func() bool { return e.function().Status.Selector != "" })
	e.c.Expect("default", "hello", fn.UID, 5)
	e.until("2 replicas (max) before any write", func() bool { return len(e.replicas()) == 2 })
	if r := e.function().Spec.Replicas; r != nil {
		t.Fatalf("spec.replicas %d: the test wrote none", *r)
	}
	e.readyAll()

	// The write lands, then a scale down: it is not held up.
	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Replicas = ptr(int32(2)) })
	e.stepUntil("status ready 2", functionset.StatusDelay, func() bool { return e.function().Status.ReadyReplicas == 2 })
	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Replicas = ptr(int32(0)) })
	e.until("2 draining after the scale down", func() bool { return e.count(draining) == 2 })
	e.stepUntil("no replicas", 2*time.Second, func() bool { return len(e.replicas()) == 0 })

	// Withdrawn: what it made drains.
	e.c.Expect("default", "hello", fn.UID, 1)
	e.until("1 replica", func() bool { return len(e.replicas()) == 1 })
	e.c.Expect("default", "hello", fn.UID, 0)
	e.until("it drains once withdrawn", func() bool { return e.count(draining) == 1 })

	// An expectation of an earlier Function of the name counts for nothing.
	e.stepUntil("no replicas", 2*time.Second, func() bool { return len(e.replicas()) == 0 })
	e.c.Expect("default", "hello", "an-earlier-uid", 1)
	e.updateSpec(func(fn *v1alpha1.Function) {
		fn.Spec.Env = append(fn.Spec.Env, v1alpha1.EnvVar{Name: "POKE", Value: "1"})
	})
	e.stepUntil("status of the new generation", functionset.StatusDelay, func() bool { return e.function().Status.ObservedGeneration == e.function().Generation })
	if n := len(e.replicas()); n != 0 {
		t.Fatalf("%d replicas for another Function's expectation", n)
	}
}

// Each replica is handed to Created as its create returned it (the
// scheduler's hint, in the same process), once.
func TestEachReplicaIsToldOfAsCreated(t *testing.T) {
	var mu sync.Mutex
	told := map[string]*v1alpha1.Run{}
	calls := 0
	each := make(chan struct{}, 8)
	e := newEnvWith(t, nil, func(r *v1alpha1.Run) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		told[r.Name] = r
		each <- struct{}{}
	})
	if _, err := e.st.Functions().Create(e.ctx, newFunction(2, 4)); err != nil {
		t.Fatal(err)
	}
	// The hook runs after the create returned, so the informer may show
	// a replica before its call: wait for the calls themselves.
	for range 2 {
		select {
		case <-each:
		case <-time.After(20 * time.Second):
			t.Fatal("Created was not called twice")
		}
	}
	e.until("2 replicas", func() bool { return len(e.replicas()) == 2 })
	// Syncs after the replicas are seen (the status write's) tell no more.
	e.stepUntil("status of 2 replicas", functionset.StatusDelay, func() bool { return e.function().Status.Replicas == 2 })
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("Created called %d times, want 2", calls)
	}
	for _, r := range e.replicas() {
		got := told[r.Name]
		if got == nil || got.UID != r.UID || got.CreationTimestamp.IsZero() || got.ResourceVersion == "" {
			t.Errorf("replica %s: Created was told %+v", r.Name, got)
		}
	}
}

// TestAScaleFromZerosStatusIsOneWriteAfterIt: the status changes of a
// scale from zero (the new generation observed, the autoscaler's
// decision told to Record, a replica counted, then Ready) wait
// StatusDelay from the first and go in one write, off the API writes the
// first answer waits for; before, each went at once (two writes or
// more).
func TestAScaleFromZerosStatusIsOneWriteAfterIt(t *testing.T) {
	e := newEnv(t)
	if _, err := e.st.Functions().Create(e.ctx, newFunction(0, 2)); err != nil {
		t.Fatal(err)
	}
	e.stepUntil("status written", functionset.StatusDelay, func() bool { return e.function().Status.Selector != "" })
	before := e.statusWrites.Load()
	e.updateSpec(func(fn *v1alpha1.Function) { fn.Spec.Replicas = ptr(int32(1)) })
	scaled := v1alpha1.ScaleDecision{Time: metav1.NewTime(t0), From: 0, To: 1, Reason: "1 queued"}
	e.c.Record("default", "hello", e.function().UID, scaled)
	e.until("1 replica", func() bool { return len(e.replicas()) == 1 })
	e.readyAll()
	e.until("the replica Ready", func() bool { return e.count(isReadyRun) == 1 })
	if s := e.function().Status; s.Replicas != 0 || s.ObservedGeneration == e.function().Generation {
		t.Fatalf("status written before StatusDelay passed: %+v", s)
	}
	e.stepUntil("status of the ready replica", functionset.StatusDelay, func() bool {
		s, fn := e.function().Status, e.function()
		return s.Replicas == 1 && s.ReadyReplicas == 1 && s.ObservedGeneration == fn.Generation &&
			s.LastScale != nil && s.LastScale.Reason == scaled.Reason
	})
	if n := e.statusWrites.Load() - before; n != 1 {
		t.Fatalf("%d status writes for the scale from zero, want 1", n)
	}
}

func isReadyRun(r *v1alpha1.Run) bool { return r.Status.Phase == v1alpha1.PhaseReady }
