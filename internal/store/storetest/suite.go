// Package storetest is the conformance suite for store.Store. Every
// implementation runs it (the SQLite store now, the Kubernetes-backed store
// later), so that the control plane behaves the same in standalone and
// Kubernetes mode. The suite uses only the store interfaces and the errdefs
// categories, never an implementation's internals; it uses the namespaces
// "default", "team-a" and "team-b", which a Kubernetes harness must create.
//
// Most tests run once per kind (Run and Runtime) from one generic table;
// a few are about both kinds at once or about Runs only (phase and
// assigned pod filters).
//
// resourceVersions are opaque, as in Kubernetes: the suite compares them
// for equality only, and checks order through what Watch delivers. An
// implementation with stronger promises (SQLite's one growing counter)
// tests those itself.
//
// NewStore must return an empty store: a Kubernetes harness deletes the
// suite's objects between tests.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// Namespaces the suite writes to.
const (
	nsDefault = store.DefaultNamespace
	nsA       = "team-a"
	nsB       = "team-b"
)

// Option configures Run.
type Option func(*config)

type config struct {
	historyLimit int
	expire       func(t *testing.T)
	timeout      time.Duration
}

// WithHistoryLimit tells the suite that the store keeps at most n changes
// for Watch, so that after n more writes a watch from an old version must
// fail with errdefs.ErrExpired.
func WithHistoryLimit(n int) Option {
	return func(c *config) { c.historyLimit = n }
}

// WithExpiry gives the suite another way to make every version written so
// far too old to watch from, for a store whose history is not bounded by a
// count: a Kubernetes API server keeps its watch history in a cache that
// starts anew when the server restarts, so the Kubernetes harness restarts
// it. expire returns once the store answers again. The suite needs this
// or WithHistoryLimit.
func WithExpiry(expire func(t *testing.T)) Option {
	return func(c *config) { c.expire = expire }
}

// WithTimeout bounds each wait for an event or a closed channel (default
// 20 s). A wait that ends this way is a failure: the suite never uses
// sleeps to order anything.
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// NewStore returns a new, empty store for one test and arranges for it to
// be closed (t.Cleanup) when the test ends.
type NewStore func(t *testing.T) store.Store

// Run runs the whole suite against the stores newStore returns.
func Run(t *testing.T, newStore NewStore, opts ...Option) {
	cfg := &config{timeout: 20 * time.Second}
	for _, o := range opts {
		o(cfg)
	}
	t.Run("Run", func(t *testing.T) { runKind(t, newStore, cfg, runCase) })
	t.Run("Runtime", func(t *testing.T) { runKind(t, newStore, cfg, runtimeCase) })
	t.Run("Function", func(t *testing.T) { runKind(t, newStore, cfg, functionCase) })
	t.Run("WorkflowRun", func(t *testing.T) { runKind(t, newStore, cfg, workflowRunCase) })
	t.Run("Workflow", func(t *testing.T) { runKind(t, newStore, cfg, workflowCase) })
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s store.Store, cfg *config)
	}{
		{"SameNameInBothKinds", testSameNameInBothKinds},
		{"ListRunPhases", testListRunPhases},
		{"ListAssignedPod", testListAssignedPod},
		{"ListWatchPlacedPod", testListWatchPlacedPod},
		{"WatchAssignedPod", testWatchAssignedPod},
		{"WatchPhase", testWatchPhase},
		{"WatchSeesOneKind", testWatchSeesOneKind},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t), cfg) })
	}
}

// kindCase is what the generic tests need to know about a kind.
type kindCase[T store.Object] struct {
	name     string
	resource func(store.Store) store.Resource[T]
	// object returns a new object with a valid spec.
	object func(namespace, name string) T
	// setSpec and setStatus change the spec or status to a value derived
	// from i, so that different i give different values, none of them the
	// value object starts with.
	setSpec   func(obj T, i int)
	setStatus func(obj T, i int)
	spec      func(obj T) any
	status    func(obj T) any
}

var runCase = kindCase[*v1alpha1.Run]{
	name:     "run",
	resource: func(s store.Store) store.Resource[*v1alpha1.Run] { return s.Runs() },
	object: func(namespace, name string) *v1alpha1.Run {
		r := &v1alpha1.Run{}
		r.Namespace, r.Name = namespace, name
		r.Spec = v1alpha1.RunSpec{
			Runtime: "bash",
			Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh", Args: []string{"one", "two"}}},
			Env:     []v1alpha1.EnvVar{{Name: "A", Value: "1"}},
		}
		return r
	},
	setSpec: func(r *v1alpha1.Run, i int) {
		ttl := int32(i)
		r.Spec.TTLSecondsAfterFinished = &ttl
	},
	setStatus: func(r *v1alpha1.Run, i int) {
		r.Status.Phase = v1alpha1.PhaseRunning
		r.Status.Attempt = int32(i)
		r.Status.Message = "attempt " + strconv.Itoa(i)
		r.Status.Outputs = map[string]string{"I": strconv.Itoa(i)}
	},
	spec:   func(r *v1alpha1.Run) any { return r.Spec },
	status: func(r *v1alpha1.Run) any { return r.Status },
}

var runtimeCase = kindCase[*v1alpha1.Runtime]{
	name:     "runtime",
	resource: func(s store.Store) store.Resource[*v1alpha1.Runtime] { return s.Runtimes() },
	object: func(namespace, name string) *v1alpha1.Runtime {
		r := &v1alpha1.Runtime{}
		r.Namespace, r.Name = namespace, name
		r.Spec = v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 4}
		return r
	},
	setSpec:   func(r *v1alpha1.Runtime, i int) { r.Spec.Replicas = int32(i) + 10 },
	setStatus: func(r *v1alpha1.Runtime, i int) { r.Status.ReadyPods = int32(i) + 1 },
	spec:      func(r *v1alpha1.Runtime) any { return r.Spec },
	status:    func(r *v1alpha1.Runtime) any { return r.Status },
}

var functionCase = kindCase[*v1alpha1.Function]{
	name:     "function",
	resource: func(s store.Store) store.Resource[*v1alpha1.Function] { return s.Functions() },
	object: func(namespace, name string) *v1alpha1.Function {
		f := &v1alpha1.Function{}
		f.Namespace, f.Name = namespace, name
		f.Spec = v1alpha1.FunctionSpec{
			Runtime:      "python",
			Handler:      "main.handler",
			Source:       &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.py", Text: "def handler(event, context):\n    return event\n"}},
			Env:          []v1alpha1.EnvVar{{Name: "A", Value: "1"}},
			Scale:        v1alpha1.FunctionScale{Min: 1, Max: 4, TargetInFlight: 1, IdleSeconds: 60},
			Queue:        v1alpha1.FunctionQueue{Length: 16, MaxWait: &metav1.Duration{Duration: 5 * time.Second}},
			DrainSeconds: 2,
		}
		return f
	},
	setSpec: func(f *v1alpha1.Function, i int) {
		n := int32(i)
		f.Spec.Replicas = &n
		f.Spec.Scale.Max = n + 10
	},
	setStatus: func(f *v1alpha1.Function, i int) {
		f.Status.Replicas = int32(i)
		f.Status.ReadyReplicas = int32(i)
		f.Status.Queued = int32(i) + 1
		f.Status.Selector = v1alpha1.LabelFunction + "=x"
		f.Status.LastScale = &v1alpha1.ScaleDecision{Time: metav1.NewTime(time.Unix(int64(1700000000+i), 0)), From: int32(i), To: int32(i) + 1, Reason: "load " + strconv.Itoa(i)}
	},
	spec:   func(f *v1alpha1.Function) any { return f.Spec },
	status: func(f *v1alpha1.Function) any { return f.Status },
}

// workflowJobs is a small DAG with a matrix and a call, so that the
// stores carry every shape of a WorkflowRun's spec (include's JSON too,
// its keys in order: the API server sorts a free-form object's keys).
func workflowJobs() []v1alpha1.Job {
	ff := false
	return []v1alpha1.Job{
		{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{
			{Uses: v1alpha1.UsesCheckout},
			{ID: "b", Run: "echo v=1 >> \"$GITHUB_OUTPUT\"", Env: []v1alpha1.EnvVar{{Name: "A", Value: "${{ matrix.os }}"}}},
		}, Outputs: []v1alpha1.NameValue{{Name: "v", Value: "${{ steps.b.outputs.v }}"}}},
		{ID: "test", Needs: []string{"build"}, RunsOn: "bash", Strategy: &v1alpha1.Strategy{
			FailFast: &ff, MaxParallel: 2,
			Matrix: &v1alpha1.Matrix{
				Axes:    []v1alpha1.MatrixAxis{{Name: "os", Values: []apiextensionsv1.JSON{{Raw: []byte(`"linux"`)}, {Raw: []byte(`{"v":1}`)}}}},
				Include: []apiextensionsv1.JSON{{Raw: []byte(`{"extra":true,"os":"linux"}`)}},
			},
		}, Steps: []v1alpha1.Step{{Run: "true", Shell: "sh"}}},
		{ID: "call", Needs: []string{"test"}, If: "always()", Uses: "lib", With: []v1alpha1.NameValue{{Name: "x", Value: "1"}}},
	}
}

var workflowRunCase = kindCase[*v1alpha1.WorkflowRun]{
	name:     "workflowrun",
	resource: func(s store.Store) store.Resource[*v1alpha1.WorkflowRun] { return s.WorkflowRuns() },
	object: func(namespace, name string) *v1alpha1.WorkflowRun {
		w := &v1alpha1.WorkflowRun{}
		w.Namespace, w.Name = namespace, name
		w.Spec = v1alpha1.WorkflowRunSpec{Jobs: workflowJobs(), Env: []v1alpha1.EnvVar{{Name: "A", Value: "1"}}}
		return w
	},
	setSpec: func(w *v1alpha1.WorkflowRun, i int) {
		ttl := int32(i)
		w.Spec.TTLSecondsAfterFinished = &ttl
	},
	setStatus: func(w *v1alpha1.WorkflowRun, i int) {
		code := int32(i)
		w.Status.Phase = v1alpha1.WorkflowRunning
		w.Status.Message = "attempt " + strconv.Itoa(i)
		w.Status.Jobs = []v1alpha1.JobStatus{{
			Name: "test (linux)", Job: "test", Matrix: map[string]string{"os": `"linux"`}, Phase: v1alpha1.JobRunning, Attempt: int32(i),
			Steps: []v1alpha1.StepStatus{{Name: "true", Phase: v1alpha1.JobFailed, Outcome: "failure", Conclusion: "failure", ExitCode: &code}},
		}}
	},
	spec:   func(w *v1alpha1.WorkflowRun) any { return w.Spec },
	status: func(w *v1alpha1.WorkflowRun) any { return w.Status },
}

var workflowCase = kindCase[*v1alpha1.Workflow]{
	name:     "workflow",
	resource: func(s store.Store) store.Resource[*v1alpha1.Workflow] { return s.Workflows() },
	object: func(namespace, name string) *v1alpha1.Workflow {
		w := &v1alpha1.Workflow{}
		w.Namespace, w.Name = namespace, name
		w.Spec = v1alpha1.WorkflowSpec{
			Inputs:  []v1alpha1.WorkflowInput{{Name: "x", Type: "number", Required: true}},
			Outputs: []v1alpha1.NameValue{{Name: "v", Value: "${{ jobs.build.outputs.v }}"}},
			Jobs:    workflowJobs()[:1],
		}
		return w
	},
	setSpec: func(w *v1alpha1.Workflow, i int) {
		w.Spec.Inputs[0].Default = strconv.Itoa(i)
	},
	setStatus: func(w *v1alpha1.Workflow, i int) {
		w.Status.ObservedGeneration = int64(i) + 1
	},
	spec:   func(w *v1alpha1.Workflow) any { return w.Spec },
	status: func(w *v1alpha1.Workflow) any { return w.Status },
}

// env is what one generic test gets.
type env[T store.Object] struct {
	t   *testing.T
	ctx context.Context
	s   store.Store
	r   store.Resource[T]
	k   kindCase[T]
	cfg *config
}

func runKind[T store.Object](t *testing.T, newStore NewStore, cfg *config, k kindCase[T]) {
	for _, tc := range []struct {
		name string
		fn   func(e *env[T])
	}{
		{"CreateGet", testCreateGet[T]},
		{"CreateDefaultsAndValidation", testCreateDefaultsAndValidation[T]},
		{"AlreadyExists", testAlreadyExists[T]},
		{"NotFound", testNotFound[T]},
		{"List", testList[T]},
		{"UpdateIgnoresStatus", testUpdateIgnoresStatus[T]},
		{"UpdateStatusIgnoresSpec", testUpdateStatusIgnoresSpec[T]},
		{"Conflict", testConflict[T]},
		{"NoOpUpdate", testNoOpUpdate[T]},
		{"ResourceVersionChanges", testResourceVersionChanges[T]},
		{"DeleteWithoutFinalizers", testDeleteWithoutFinalizers[T]},
		{"DeleteWithFinalizers", testDeleteWithFinalizers[T]},
		{"DeletePreconditions", testDeletePreconditions[T]},
		{"WatchFromNow", testWatchFromNow[T]},
		{"WatchFromListVersion", testWatchFromListVersion[T]},
		{"WatchReplayConcurrentWriters", testWatchReplayConcurrentWriters[T]},
		{"WatchNamespace", testWatchNamespace[T]},
		{"WatchInvalidVersion", testWatchInvalidVersion[T]},
		{"WatchExpired", testWatchExpired[T]},
		{"SlowWatcherDoesNotBlockWriters", testSlowWatcher[T]},
		{"WatchEndsWithContextAndStop", testWatchEnds[T]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env[T]{t: t, ctx: testContext(t, cfg), s: newStore(t), k: k, cfg: cfg}
			e.r = k.resource(e.s)
			tc.fn(e)
		})
	}
}

func testContext(t *testing.T, cfg *config) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*cfg.timeout)
	t.Cleanup(cancel)
	return ctx
}

// create creates a fresh object or fails the test.
func (e *env[T]) create(namespace, name string, edit ...func(T)) T {
	e.t.Helper()
	obj := e.k.object(namespace, name)
	for _, f := range edit {
		f(obj)
	}
	got, err := e.r.Create(e.ctx, obj)
	if err != nil {
		e.t.Fatalf("create %s %s/%s: %v", e.k.name, namespace, name, err)
	}
	return got
}

func (e *env[T]) get(namespace, name string) T {
	e.t.Helper()
	got, err := e.r.Get(e.ctx, namespace, name)
	if err != nil {
		e.t.Fatalf("get %s %s/%s: %v", e.k.name, namespace, name, err)
	}
	return got
}

// updateStatus sets status i on obj's current state or fails the test.
func (e *env[T]) updateStatus(obj T, i int) T {
	e.t.Helper()
	obj = obj.DeepCopyObject().(T)
	e.k.setStatus(obj, i)
	got, err := e.r.UpdateStatus(e.ctx, obj)
	if err != nil {
		e.t.Fatalf("update status of %s %s/%s: %v", e.k.name, obj.GetNamespace(), obj.GetName(), err)
	}
	return got
}

// newVersion fails unless a write's resourceVersion is set and differs
// from the version before it.
func newVersion(t testing.TB, what, got, before string) {
	t.Helper()
	if got == "" || got == before {
		t.Fatalf("%s: resourceVersion %q, want a new one after %q", what, got, before)
	}
}

// wantErr fails unless err wraps category and its message mentions each
// of the substrings (the object's name, usually).
func wantErr(t testing.TB, err, category error, substrings ...string) {
	t.Helper()
	if !errors.Is(err, category) {
		t.Fatalf("got error %v, want one wrapping %q", err, category)
	}
	for _, s := range substrings {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

// sameObject fails unless got and want are semantically equal, ignoring
// TypeMeta (a typed Kubernetes client may leave it empty).
func sameObject[T store.Object](t testing.TB, what string, got, want T) {
	t.Helper()
	g, w := got.DeepCopyObject().(T), want.DeepCopyObject().(T)
	g.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	w.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	if !equality.Semantic.DeepEqual(g, w) {
		t.Fatalf("%s:\n got  %s\n want %s", what, toJSON(g), toJSON(w))
	}
}

// sameValue fails unless got and want are semantically equal.
func sameValue(t testing.TB, what string, got, want any) {
	t.Helper()
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %s\n want %s", what, toJSON(got), toJSON(want))
	}
}

func toJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

func names[T store.Object](items []T) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.GetNamespace()+"/"+it.GetName())
	}
	sort.Strings(out)
	return out
}
