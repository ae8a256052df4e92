package workflow_test

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/workflow"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

// env runs a Controller over a real SQLite store with a fake clock; the
// test plays the scheduler and runtimed for the step Runs.
type env struct {
	t       *testing.T
	ctx     context.Context
	st      *sqlite.Store
	clk     *testingclock.FakeClock
	runs    *informer.Informer[*v1alpha1.Run]
	wfs     *informer.Informer[*v1alpha1.WorkflowRun]
	changed chan struct{}
	stop    func()
}

func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	return newEnvDeferring(t, dir, nil)
}

// newEnvDeferring is newEnv with Config.Defer.
func newEnvDeferring(t *testing.T, dir string, deferFn func([]informer.Key) func()) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fc := testingclock.NewFakeClock(t0)
	st, err := sqlite.Open(ctx, dir, sqlite.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &env{t: t, ctx: ctx, st: st, clk: fc, changed: make(chan struct{}, 1),
		runs: informer.New(st.Runs(), informer.Options{Logger: log}),
		wfs:  informer.New(st.WorkflowRuns(), informer.Options{Logger: log})}
	rts := informer.New(st.Runtimes(), informer.Options{Logger: log})
	poke := func() {
		select {
		case e.changed <- struct{}{}:
		default:
		}
	}
	e.runs.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{AddFunc: func(*v1alpha1.Run) { poke() },
		UpdateFunc: func(_, _ *v1alpha1.Run) { poke() }, DeleteFunc: func(*v1alpha1.Run) { poke() }})
	e.wfs.AddEventHandler(informer.HandlerFuncs[*v1alpha1.WorkflowRun]{AddFunc: func(*v1alpha1.WorkflowRun) { poke() },
		UpdateFunc: func(_, _ *v1alpha1.WorkflowRun) { poke() }, DeleteFunc: func(*v1alpha1.WorkflowRun) { poke() }})
	c, err := workflow.New(workflow.Config{WorkflowRuns: st.WorkflowRuns(), Workflows: st.Workflows(), Runs: st.Runs(),
		WorkflowRunInformer: e.wfs, RunInformer: e.runs, RuntimeInformer: rts, DeleteRuns: true, Defer: deferFn, Clock: fc, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{e.runs.Run, e.wfs.Run, rts.Run, c.Run} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			st.Close()
		})
	}
	t.Cleanup(e.stop)
	return e
}

// until waits for cond, re-checking it on every change the informers see.
func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-e.changed:
		case <-deadline:
			e.t.Fatalf("waited 20 s for %s; runs: %v", what, e.stepRuns())
		}
	}
}

func (e *env) stepRuns() []*v1alpha1.Run {
	out := e.runs.List(func(r *v1alpha1.Run) bool { return r.Labels[workflow.LabelWorkflowRun] == "ci" })
	sort.Slice(out, func(i, j int) bool {
		return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) || out[i].Name < out[j].Name
	})
	return out
}

func (e *env) wf() *v1alpha1.WorkflowRun {
	wf, err := e.st.WorkflowRuns().Get(e.ctx, "default", "ci")
	if err != nil {
		e.t.Fatal(err)
	}
	return wf
}

// finish plays the scheduler and runtimed: run is assigned to pod and
// ends in phase.
func (e *env) finish(name, pod string, phase v1alpha1.Phase, outputs map[string]string) {
	e.t.Helper()
	err := store.RetryOnConflict(func() error {
		run, err := e.st.Runs().Get(e.ctx, "default", name)
		if err != nil {
			return err
		}
		if p := run.Spec.Placement; p != nil && p.PodUID != "" {
			pod = p.PodUID
		}
		run.Status.AssignedPod, run.Status.AssignedPodUID = "pod-"+pod, pod
		run.Status.Phase, run.Status.Outputs = phase, outputs
		code := int32(0)
		if phase != v1alpha1.PhaseSucceeded {
			code = 1
			run.Status.Reason = "NonZeroExit"
		}
		run.Status.ExitCode = &code
		_, err = e.st.Runs().UpdateStatus(e.ctx, run)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func TestControllerRunsAWorkflowRunOnTheStore(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"}, Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "a", RunsOn: "bash", Steps: []v1alpha1.Step{{ID: "s", Run: "echo x=1 >> $GITHUB_OUTPUT"}, {Run: "true"}},
			Outputs: []v1alpha1.NameValue{{Name: "x", Value: "${{ steps.s.outputs.x }}"}}},
		{ID: "b", RunsOn: "bash", Needs: []string{"a"}, Steps: []v1alpha1.Step{{Run: `echo "${{ needs.a.outputs.x }}"`}}},
	}}}
	created, err := e.st.WorkflowRuns().Create(e.ctx, wf)
	if err != nil {
		t.Fatal(err)
	}
	e.until("a's first step Run", func() bool { return len(e.stepRuns()) == 1 })
	first := e.stepRuns()[0]
	if o := metav1.GetControllerOf(first); o == nil || o.UID != created.UID || o.Kind != v1alpha1.KindWorkflowRun {
		t.Fatalf("owner %+v", first.OwnerReferences)
	}
	e.finish(first.Name, "p1", v1alpha1.PhaseSucceeded, map[string]string{"x": "1"})
	e.until("a's second step", func() bool { return len(e.stepRuns()) == 2 })

	// A restart: a new controller over the same store makes nothing
	// again, and carries on.
	e.stop()
	e = newEnv(t, dir)
	e.until("the informer", func() bool { return len(e.stepRuns()) == 2 })
	second := e.stepRuns()[1]
	if second.Spec.Placement.PodUID != "p1" {
		t.Fatalf("second step not pinned: %+v", second.Spec.Placement)
	}
	e.finish(second.Name, "", v1alpha1.PhaseSucceeded, nil)
	e.until("b's step", func() bool { return len(e.stepRuns()) == 3 })
	b := e.stepRuns()[2]
	if b.Spec.Env[len(b.Spec.Env)-1].Value != "1" {
		t.Errorf("b's env %v", b.Spec.Env)
	}
	e.finish(b.Name, "p2", v1alpha1.PhaseSucceeded, nil)
	e.until("Succeeded", func() bool { return e.wf().Status.Phase == v1alpha1.WorkflowSucceeded })
	if n := len(e.stepRuns()); n != 3 {
		t.Errorf("%d step Runs, want 3", n)
	}

	// Deleting the WorkflowRun deletes its step Runs (standalone).
	if err := e.st.WorkflowRuns().Delete(e.ctx, "default", "ci", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.until("its step Runs deleted", func() bool { return len(e.stepRuns()) == 0 })
}

// A WorkflowRun written past the validation (as kubectl writes one: the
// CRD checks no expression, DAG or call) ends Failed when it starts, with
// the validation's message naming the field, and makes no step Run.
func TestControllerRefusesAnInvalidWorkflowRunAtStart(t *testing.T) {
	e := newEnv(t, t.TempDir())
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"}, Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "a", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "true"}}},
		{ID: "b", RunsOn: "bash", Needs: []string{"a"}, Steps: []v1alpha1.Step{{Run: "echo ${{ needs.a.outputs.x "}}},
	}}}
	if _, err := e.st.WorkflowRuns().Create(e.ctx, wf); err != nil {
		t.Fatal(err)
	}
	e.until("Failed", func() bool { return e.wf().Status.Phase == v1alpha1.WorkflowFailed })
	st := e.wf().Status
	for _, want := range []string{"spec.jobs[1].steps[0].run: an expression does not parse"} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("message %q does not name %q", st.Message, want)
		}
	}
	if st.Reason != "InvalidSpec" || st.StartTime == nil || st.CompletionTime == nil || len(st.Jobs) != 0 {
		t.Errorf("status %+v", st)
	}
	if runs := e.stepRuns(); len(runs) != 0 {
		t.Errorf("%d step Runs made", len(runs))
	}
}

// The Workflows a run calls are copied into status.snapshot.called when
// it starts: editing one while the run runs (and restarting the
// controller) changes nothing of that run.
func TestControllerRunsTheCalledWorkflowsAsTheyWereAtStart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	lib := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "lib", Namespace: "default"}, Spec: v1alpha1.WorkflowSpec{
		Inputs:  []v1alpha1.WorkflowInput{{Name: "msg", Required: true}},
		Outputs: []v1alpha1.NameValue{{Name: "said", Value: "${{ jobs.say.outputs.said }}"}},
		Jobs: []v1alpha1.Job{{ID: "say", RunsOn: "bash", Steps: []v1alpha1.Step{{ID: "s", Run: `echo "v1 ${{ inputs.msg }}"`}, {Run: "echo v1 second"}},
			Outputs: []v1alpha1.NameValue{{Name: "said", Value: "${{ steps.s.outputs.said }}"}}}},
	}}
	if _, err := e.st.Workflows().Create(e.ctx, lib); err != nil {
		t.Fatal(err)
	}
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"}, Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "call", Uses: "lib", With: []v1alpha1.NameValue{{Name: "msg", Value: "hi"}}},
	}}}
	if _, err := e.st.WorkflowRuns().Create(e.ctx, wf); err != nil {
		t.Fatal(err)
	}
	// The status (with the snapshot) is written after the step Run is made.
	e.until("call/say's step Run", func() bool { return len(e.stepRuns()) == 1 && len(e.wf().Status.Jobs) == 2 })
	snap := e.wf().Status.Snapshot
	if snap == nil || snap.Spec != nil || len(snap.Called) != 1 || snap.Called[0].Name != "lib" || len(snap.Called[0].Spec.Jobs) != 1 {
		t.Fatalf("snapshot %+v", snap)
	}

	// Edit lib: another text for the step not yet started, other
	// outputs, and a second job.
	err := store.RetryOnConflict(func() error {
		cur, err := e.st.Workflows().Get(e.ctx, "default", "lib")
		if err != nil {
			return err
		}
		cur.Spec.Jobs[0].Steps[1].Run = "echo v2 second"
		cur.Spec.Outputs[0].Value = "v2"
		cur.Spec.Jobs = append(cur.Spec.Jobs, v1alpha1.Job{ID: "extra", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "true"}}})
		_, err = e.st.Workflows().Update(e.ctx, cur)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	e = newEnv(t, dir)
	e.until("the informer", func() bool { return len(e.stepRuns()) == 1 })
	say := e.stepRuns()[0]
	if say.Labels[workflow.LabelJob] != "call-say" || say.Spec.Source == nil || say.Spec.Source.Inline == nil || !strings.HasPrefix(say.Spec.Source.Inline.Text, `echo "v1 `) {
		t.Fatalf("call/say's Run: %v %+v", say.Labels, say.Spec.Source)
	}
	e.finish(say.Name, "p1", v1alpha1.PhaseSucceeded, map[string]string{"said": "v1 hi"})
	e.until("call/say's second step", func() bool { return len(e.stepRuns()) == 2 })
	second := e.stepRuns()[1]
	if second.Spec.Source == nil || second.Spec.Source.Inline == nil || second.Spec.Source.Inline.Text != "echo v1 second" {
		t.Fatalf("call/say's second step runs the edited Workflow: %+v", second.Spec.Source)
	}
	e.finish(second.Name, "", v1alpha1.PhaseSucceeded, nil)
	e.until("Succeeded", func() bool { return e.wf().Status.Phase.Terminal() })
	st := e.wf().Status
	var names []string
	for _, j := range st.Jobs {
		names = append(names, j.Name+"="+string(j.Phase))
	}
	if st.Phase != v1alpha1.WorkflowSucceeded || strings.Join(names, " ") != "call=Succeeded call/say=Succeeded" {
		t.Errorf("run %s: %v", st.Phase, names)
	}
	if out := st.Jobs[0].Outputs; len(out) != 1 || out[0].Value != "v1 hi" {
		t.Errorf("call's outputs %v", out)
	}
	if n := len(e.stepRuns()); n != 2 {
		t.Errorf("%d step Runs, want 2 (the edited Workflow's extra job must not run)", n)
	}
}

// start plays the scheduler and runtimed for a step Run that starts: it is
// assigned to pod and Running.
func (e *env) start(name, pod string) {
	e.t.Helper()
	err := store.RetryOnConflict(func() error {
		run, err := e.st.Runs().Get(e.ctx, "default", name)
		if err != nil {
			return err
		}
		run.Status.AssignedPod, run.Status.AssignedPodUID = "pod-"+pod, pod
		run.Status.Phase = v1alpha1.PhaseRunning
		_, err = e.st.Runs().UpdateStatus(e.ctx, run)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// A step's start alone is not written at once: the status write that
// records it comes a moment later (or with the next change that must be
// written), so that a short step costs one write of the WorkflowRun, not
// two, and no write of a start is in flight when its end is decided.
// Another WorkflowRun is the barrier: the controller syncs WorkflowRuns
// in the order their Runs changed, so once the other's next write is
// seen, the start has been decided.
func TestControllerHoldsAStepsStartBack(t *testing.T) {
	e := newEnv(t, t.TempDir())
	one := func(name string, steps ...v1alpha1.Step) {
		wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
			{ID: "a", RunsOn: "bash", Steps: steps}}}}
		if _, err := e.st.WorkflowRuns().Create(e.ctx, wf); err != nil {
			t.Fatal(err)
		}
	}
	one("ci", v1alpha1.Step{Run: "true"}, v1alpha1.Step{Run: "true"})
	one("other", v1alpha1.Step{Run: "true"}, v1alpha1.Step{Run: "true"}, v1alpha1.Step{Run: "true"}, v1alpha1.Step{Run: "true"})
	get := func(name string) *v1alpha1.WorkflowRun {
		wf, err := e.st.WorkflowRuns().Get(e.ctx, "default", name)
		if err != nil {
			t.Fatal(err)
		}
		return wf
	}
	stepOf := func(wf *v1alpha1.WorkflowRun, i int) v1alpha1.StepStatus {
		if len(wf.Status.Jobs) != 1 || len(wf.Status.Jobs[0].Steps) <= i {
			return v1alpha1.StepStatus{}
		}
		return wf.Status.Jobs[0].Steps[i]
	}
	e.until("both first step Runs made and written", func() bool {
		return stepOf(get("ci"), 0).Run != "" && stepOf(get("other"), 0).Run != ""
	})
	first := stepOf(get("ci"), 0).Run
	before := get("ci")
	// barrier ends the other's next step and waits for its write.
	barrier := 0
	next := func() {
		t.Helper()
		e.finish(stepOf(get("other"), barrier).Run, "p2", v1alpha1.PhaseSucceeded, nil)
		barrier++
		e.until("the other's next write", func() bool {
			wf := get("other")
			return stepOf(wf, barrier).Run != "" || wf.Status.Phase == v1alpha1.WorkflowSucceeded
		})
	}

	e.start(first, "p1")
	next()
	if wf := get("ci"); wf.ResourceVersion != before.ResourceVersion {
		t.Fatalf("the step's start was written at once: step %+v, job pod %q", stepOf(wf, 0), wf.Status.Jobs[0].PodUID)
	}

	// The step ends before its start was written: one write records
	// both, and makes the next step, on the same pod.
	e.finish(first, "p1", v1alpha1.PhaseSucceeded, nil)
	e.until("the second step's Run", func() bool { return stepOf(get("ci"), 1).Run != "" })
	second := stepOf(get("ci"), 1).Run

	// The next start is held too, and written once due, although the
	// timer armed for the first start (written over since; the delay is
	// 100 ms) fires before it is due.
	e.clk.Step(60 * time.Millisecond)
	e.start(second, "p1")
	next()
	if wf := get("ci"); stepOf(wf, 1).Phase != v1alpha1.JobPending {
		t.Fatalf("the second step's start was written at once: %+v", stepOf(wf, 1))
	}
	// The first start's timer is due: two more writes of the other
	// WorkflowRun see to it that the controller's loop came round to it.
	e.clk.Step(60 * time.Millisecond)
	next()
	next()
	e.clk.Step(time.Second)
	e.until("the second start written", func() bool { return stepOf(get("ci"), 1).Phase == v1alpha1.JobRunning })
	if wf := get("ci"); wf.Status.Jobs[0].PodUID != "p1" || stepOf(wf, 1).StartTime == nil {
		t.Errorf("job %+v", wf.Status.Jobs[0])
	}
	e.finish(second, "p1", v1alpha1.PhaseSucceeded, nil)
	e.until("Succeeded", func() bool { return get("ci").Status.Phase == v1alpha1.WorkflowSucceeded })
	wf := get("ci")
	for i := range 2 {
		if s := stepOf(wf, i); s.Phase != v1alpha1.JobSucceeded || s.StartTime == nil || s.CompletionTime == nil {
			t.Errorf("step %d: %+v", i, s)
		}
	}
}
