package autoscaler_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/autoscaler"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

const waitTimeout = 30 * time.Second

// env runs an Autoscaler over a real SQLite store and the Functions
// informer, with a fake clock and a load source the test sets, as the
// gateway's dispatcher would report it.
type env struct {
	t       *testing.T
	ctx     context.Context
	st      *sqlite.Store
	clk     *testingclock.FakeClock
	fns     *informer.Informer[*v1alpha1.Function]
	runs    *informer.Informer[*v1alpha1.Run] // with the controller only
	a       *autoscaler.Autoscaler
	changed chan struct{}

	mu    sync.Mutex
	loads map[string][2]int // name → in flight, queued
	// scales are the decisions told to Config.Record, by name.
	scales map[string][]v1alpha1.ScaleDecision
}

func newEnv(t *testing.T) *env { return newEnvWith(t, false, nil) }

// newEnvWith also runs the Function controller when withController is set;
// wrap, when set, is what the autoscaler's Functions go through.
func newEnvWith(t *testing.T, withController bool, wrap func(store.Resource[*v1alpha1.Function]) store.Resource[*v1alpha1.Function]) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fc := testingclock.NewFakeClock(t0)
	st, err := sqlite.Open(ctx, t.TempDir(), sqlite.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &env{t: t, ctx: ctx, st: st, clk: fc, changed: make(chan struct{}, 1), loads: map[string][2]int{}, scales: map[string][]v1alpha1.ScaleDecision{},
		fns: informer.New(st.Functions(), informer.Options{Logger: log})}
	e.fns.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Function]{
		AddFunc:    func(*v1alpha1.Function) { e.poke() },
		UpdateFunc: func(_, _ *v1alpha1.Function) { e.poke() },
	})
	var fns store.Resource[*v1alpha1.Function] = st.Functions()
	if wrap != nil {
		fns = wrap(fns)
	}
	var runners []func(context.Context) error
	var expect func(namespace, name string, uid types.UID, replicas int)
	var record func(namespace, name string, uid types.UID, d v1alpha1.ScaleDecision)
	if withController {
		e.runs = informer.New(st.Runs(), informer.Options{Logger: log})
		e.runs.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{AddFunc: func(*v1alpha1.Run) { e.poke() }})
		c, err := functionset.New(functionset.Config{Functions: st.Functions(), Runs: st.Runs(),
			FunctionInformer: e.fns, RunInformer: e.runs, Clock: fc, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, e.runs.Run, c.Run)
		expect, record = c.Expect, c.Record
	}
	e.a, err = autoscaler.New(autoscaler.Config{
		Functions: fns, FunctionInformer: e.fns, Clock: fc, Logger: log, Expect: expect,
		Record: func(namespace, name string, uid types.UID, d v1alpha1.ScaleDecision) {
			e.mu.Lock()
			e.scales[name] = append(e.scales[name], d)
			e.mu.Unlock()
			if record != nil {
				record(namespace, name, uid, d)
			}
			e.poke()
		},
		Load: func(_, name string) (int, int) {
			e.mu.Lock()
			defer e.mu.Unlock()
			l := e.loads[name]
			return l[0], l[1]
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runners = append(runners, e.fns.Run, e.a.Run)
	var wg sync.WaitGroup
	for _, run := range runners {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = st.Close()
	})
	return e
}

func (e *env) poke() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

func (e *env) setLoad(name string, inFlight, queued int) {
	e.mu.Lock()
	e.loads[name] = [2]int{inFlight, queued}
	e.mu.Unlock()
}

func (e *env) create(name string, replicas *int32, scale v1alpha1.FunctionScale) {
	e.t.Helper()
	fn := &v1alpha1.Function{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.FunctionSpec{Runtime: "python", Handler: "main.handler", Replicas: replicas, Scale: scale,
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.py", Text: "def handler(event, context):\n    return event\n"}}},
	}
	if _, err := e.st.Functions().Create(e.ctx, fn); err != nil {
		e.t.Fatal(err)
	}
}

// waitReplicas waits until the informer shows spec.replicas = n and the
// scale to n was told to Config.Record; it returns the Function and that
// decision.
func (e *env) waitReplicas(name string, n int32) (*v1alpha1.Function, v1alpha1.ScaleDecision) {
	e.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		fn, ok := e.fns.Get("default", name)
		if d, told := e.lastScale(name); ok && fn.Spec.Replicas != nil && *fn.Spec.Replicas == n && told && d.To == n {
			return fn, d
		}
		select {
		case <-e.changed:
		case <-deadline:
			e.t.Fatalf("%s: no spec.replicas = %d; last seen %+v", name, n, fn)
		}
	}
}

// lastScale is the last decision told to Config.Record for name.
func (e *env) lastScale(name string) (v1alpha1.ScaleDecision, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ds := e.scales[name]
	if len(ds) == 0 {
		return v1alpha1.ScaleDecision{}, false
	}
	return ds[len(ds)-1], true
}

// awaitTimer waits until the autoscaler armed a timer on the fake clock
// (the clock has no event for that, so this polls).
func (e *env) awaitTimer() {
	e.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !e.clk.HasWaiters() {
		if time.Now().After(deadline) {
			e.t.Fatal("the autoscaler armed no timer")
		}
		time.Sleep(time.Millisecond)
	}
}

func ptr(n int32) *int32 { return &n }

// TestScaleFromZero: an idle Function with min 0 has no replicas asked
// for; its first queued invocation, with a Poke from the dispatcher, gets
// one at once, with the clock never stepped.
func TestScaleFromZero(t *testing.T) {
	e := newEnv(t)
	e.create("hello", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	e.setLoad("hello", 0, 1)
	e.a.Poke("default", "hello")
	_, ls := e.waitReplicas("hello", 1)
	if ls.From != 0 || !strings.Contains(ls.Reason, "1 queued") {
		t.Errorf("lastScale %+v", ls)
	}
	if !e.clk.Now().Equal(t0) {
		t.Errorf("the clock moved: %v", e.clk.Now())
	}
}

// TestScaleUpUnderLoadWithinBounds: in-flight plus queued invocations over
// targetInFlight, never above max, found by the periodic sample.
func TestScaleUpUnderLoadWithinBounds(t *testing.T) {
	e := newEnv(t)
	e.create("f", ptr(1), v1alpha1.FunctionScale{Min: 0, Max: 6, TargetInFlight: 2})
	e.setLoad("f", 1, 0)
	e.awaitTimer() // sampling: one replica above min
	e.setLoad("f", 2, 5)
	e.clk.Step(time.Second)
	e.waitReplicas("f", 4) // ceil(7 / 2)
	e.setLoad("f", 8, 40)
	e.awaitTimer()
	e.clk.Step(time.Second)
	if _, ls := e.waitReplicas("f", 6); ls.From != 4 || ls.To != 6 { // max
		t.Errorf("lastScale %+v", ls)
	}
}

// TestScaleDownAfterIdle: replicas above the load stay for idleSeconds,
// then go to what the load wanted meanwhile, not below what is in flight.
func TestScaleDownAfterIdle(t *testing.T) {
	e := newEnv(t)
	e.setLoad("f", 2, 0)
	e.create("f", ptr(6), v1alpha1.FunctionScale{Min: 0, Max: 8, IdleSeconds: 30})
	e.awaitTimer()
	for range 29 {
		e.clk.Step(time.Second)
		e.awaitTimer()
	}
	if fn, _ := e.fns.Get("default", "f"); *fn.Spec.Replicas != 6 {
		t.Fatalf("scaled before idleSeconds: replicas %d", *fn.Spec.Replicas)
	}
	if ls, told := e.lastScale("f"); told {
		t.Fatalf("scaled before idleSeconds: lastScale %+v", ls)
	}
	e.clk.Step(time.Second)
	if _, ls := e.waitReplicas("f", 2); ls.From != 6 || !strings.Contains(ls.Reason, "2 in flight") {
		t.Errorf("lastScale %+v", ls)
	}
	// Idle at last: down to min after another idleSeconds.
	e.setLoad("f", 0, 0)
	e.awaitTimer()
	e.clk.Step(time.Minute)
	e.awaitTimer()
	e.clk.Step(time.Minute)
	e.waitReplicas("f", 0)
}

// TestTheControllerFollows: the count the autoscaler sets is the one the
// Function controller keeps: scaling from zero creates a replica Run.
func TestTheControllerFollows(t *testing.T) {
	e := newEnvWith(t, true, nil)
	e.create("hello", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	e.setLoad("hello", 0, 1)
	e.a.Poke("default", "hello")
	e.waitReplicas("hello", 1)
	deadline := time.After(waitTimeout)
	for {
		replicas := e.runs.List(func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelFunction] == "hello" })
		if len(replicas) == 1 {
			return
		}
		if len(replicas) > 1 {
			t.Fatalf("%d replica Runs, want 1", len(replicas))
		}
		select {
		case <-e.changed:
		case <-deadline:
			t.Fatal("the controller made no replica Run")
		}
	}
}

// observed is the autoscaler's Functions as they reach the real store:
// it counts the reads, and before the first Update it can let another
// writer change the Function (a real conflict: the autoscaler's copy is
// then stale).
type observed struct {
	store.Resource[*v1alpha1.Function]
	mu     sync.Mutex
	gets   int
	status int                                              // UpdateStatus calls
	before func(ctx context.Context, fn *v1alpha1.Function) // once, before the first Update
}

func (o *observed) UpdateStatus(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	o.mu.Lock()
	o.status++
	o.mu.Unlock()
	return o.Resource.UpdateStatus(ctx, fn)
}

func (o *observed) Get(ctx context.Context, namespace, name string) (*v1alpha1.Function, error) {
	o.mu.Lock()
	o.gets++
	o.mu.Unlock()
	return o.Resource.Get(ctx, namespace, name)
}

func (o *observed) Update(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	o.mu.Lock()
	before := o.before
	o.before = nil
	o.mu.Unlock()
	if before != nil {
		before(ctx, fn)
	}
	return o.Resource.Update(ctx, fn)
}

func (o *observed) reads() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gets
}

// TestScaleWritesWithoutARead: a scale writes spec.replicas on the
// informer's copy and status.lastScale on what that write returned, with
// no read of the Function before either (a scale from zero waits for
// them); when the copy was stale, the conflict is retried on a fresh
// read and the other writer's change is kept.
func TestScaleWritesWithoutARead(t *testing.T) {
	var o *observed
	e := newEnvWith(t, false, func(r store.Resource[*v1alpha1.Function]) store.Resource[*v1alpha1.Function] {
		o = &observed{Resource: r}
		return o
	})
	e.create("hello", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	e.setLoad("hello", 0, 1)
	e.a.Poke("default", "hello")
	e.waitReplicas("hello", 1)
	if n := o.reads(); n != 0 {
		t.Errorf("the scale read the Function %d times before writing, want 0", n)
	}

	e.create("raced", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	o.mu.Lock()
	o.before = func(ctx context.Context, _ *v1alpha1.Function) {
		err := store.RetryOnConflict(func() error {
			cur, err := e.st.Functions().Get(ctx, "default", "raced")
			if err != nil {
				return err
			}
			cur.Labels = map[string]string{"other": "writer"}
			_, err = e.st.Functions().Update(ctx, cur)
			return err
		})
		if err != nil {
			t.Errorf("the other writer: %v", err)
		}
	}
	o.mu.Unlock()
	e.setLoad("raced", 0, 1)
	e.a.Poke("default", "raced")
	fn, _ := e.waitReplicas("raced", 1)
	if fn.Labels["other"] != "writer" {
		t.Errorf("the other writer's label is lost: %v", fn.Labels)
	}
	// At least one read, after the conflict (a second decision may follow
	// when the informer shows the other writer's version before the
	// autoscaler's: it writes the same count again, on a read of its own).
	if n := o.reads(); n < 1 {
		t.Errorf("the conflicting scale never read the Function again")
	}
}

// TestReplicaBeforeTheScaleWriteLands: scaling from zero, the Function
// controller makes the replica as the autoscaler's spec.replicas write
// starts (Config.Expect), not once the write has come back through the
// informer. Here the write is held until a replica Run exists: before,
// the replica waited for the write, and the write timed out waiting.
func TestReplicaBeforeTheScaleWriteLands(t *testing.T) {
	var runs store.Resource[*v1alpha1.Run]
	waited := make(chan bool, 1)
	e := newEnvWith(t, true, func(r store.Resource[*v1alpha1.Function]) store.Resource[*v1alpha1.Function] {
		return &observed{Resource: r, before: func(ctx context.Context, fn *v1alpha1.Function) {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				list, _, err := runs.List(ctx, store.ListOptions{Namespace: "default"})
				if err == nil && len(list) > 0 {
					waited <- true
					return
				}
				time.Sleep(5 * time.Millisecond) // polling the store: the test's own view
			}
			waited <- false
		}}
	})
	runs = e.st.Runs()
	e.create("hello", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	e.setLoad("hello", 0, 1)
	e.a.Poke("default", "hello")
	if !<-waited {
		t.Fatal("no replica Run before the autoscaler's spec.replicas write")
	}
	e.waitReplicas("hello", 1)
	// Once the write is seen, the count is spec.replicas': one replica.
	deadline := time.After(waitTimeout)
	for {
		replicas := e.runs.List(func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelFunction] == "hello" })
		if len(replicas) > 1 {
			t.Fatalf("%d replica Runs, want 1", len(replicas))
		}
		fn, _ := e.fns.Get("default", "hello")
		if len(replicas) == 1 && fn.Status.Replicas == 1 {
			return
		}
		if len(replicas) == 1 {
			// The controller writes its status StatusDelay later.
			e.clk.Step(functionset.StatusDelay)
		}
		select {
		case <-e.changed:
		case <-time.After(100 * time.Millisecond): // a step before the controller armed its timer
		case <-deadline:
			t.Fatalf("no replica in the Function's status: %+v", fn.Status)
		}
	}
}

// TestTheScaleIsInTheControllersStatusWrite: the autoscaler writes
// spec.replicas alone and tells the Function controller its decision
// (Config.Record), which puts it in status.lastScale with the replica it
// made, in its one status write StatusDelay later; before, the autoscaler
// wrote status.lastScale itself right after spec.replicas, beside the
// scale from zero's path.
func TestTheScaleIsInTheControllersStatusWrite(t *testing.T) {
	var o *observed
	e := newEnvWith(t, true, func(r store.Resource[*v1alpha1.Function]) store.Resource[*v1alpha1.Function] {
		o = &observed{Resource: r}
		return o
	})
	e.create("hello", nil, v1alpha1.FunctionScale{Min: 0, Max: 8})
	e.setLoad("hello", 0, 1)
	e.a.Poke("default", "hello")
	e.waitReplicas("hello", 1)
	deadline := time.After(waitTimeout)
	for {
		fn, _ := e.fns.Get("default", "hello")
		if ls := fn.Status.LastScale; ls != nil && ls.From == 0 && ls.To == 1 && strings.Contains(ls.Reason, "1 queued") && fn.Status.Replicas == 1 {
			break
		}
		e.clk.Step(functionset.StatusDelay)
		select {
		case <-e.changed:
		case <-time.After(100 * time.Millisecond): // a step before the controller armed its timer
		case <-deadline:
			t.Fatalf("no lastScale 0 -> 1 in the Function's status: %+v", fn.Status)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.status != 0 {
		t.Errorf("the autoscaler wrote the Function's status %d times, want 0 (the controller writes lastScale)", o.status)
	}
}
