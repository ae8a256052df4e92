package workflow

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

// sim runs decide against step Runs the test plays runtimed for: a Run
// the plan creates is Pending until the test ends it; the scheduler's
// part (a pod) the test gives when it ends it.
type sim struct {
	t    *testing.T
	wf   *v1alpha1.WorkflowRun
	runs map[string]*v1alpha1.Run
	// order are the Run names in the order they were created.
	order     []string
	now       time.Time
	arts      map[string]artifactResult
	copying   map[string]bool
	notBefore map[string]time.Time
	pods      int
	// called are the Workflows the run's snapshot holds.
	called map[string]*v1alpha1.WorkflowSpec
	// top, when set, is the Workflow spec.workflow names.
	top *v1alpha1.WorkflowSpec
	// server is every Runtime's server ("" is bash).
	server string
}

func newSim(t *testing.T, spec v1alpha1.WorkflowRunSpec) *sim {
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default", UID: "wf-uid", Generation: 1}, Spec: spec}
	return &sim{t: t, wf: wf, runs: map[string]*v1alpha1.Run{}, now: t0, arts: map[string]artifactResult{}, copying: map[string]bool{}, notBefore: map[string]time.Time{}}
}

func (s *sim) world() *world {
	spec := &v1alpha1.WorkflowSpec{Jobs: s.wf.Spec.Jobs, Env: s.wf.Spec.Env}
	if s.top != nil {
		spec = s.top
	}
	return &world{now: s.now, wf: s.wf, spec: spec,
		run:       func(name string) (*v1alpha1.Run, bool) { r, ok := s.runs[name]; return r, ok },
		server:    func(string) string { return cmpOr(s.server, "bash") },
		artifact:  func(k string) (artifactResult, bool) { r, ok := s.arts[k]; return r, ok },
		copying:   func(k string) bool { return s.copying[k] },
		notBefore: func(n string) time.Time { return s.notBefore[n] }, called: s.called}
}

// decide decides once and applies the plan as the controller would.
func (s *sim) decide() *plan {
	s.t.Helper()
	p := decide(s.world())
	for _, r := range p.create {
		if _, ok := s.runs[r.Name]; ok {
			continue // AlreadyExists
		}
		r = r.DeepCopy()
		r.Status.Phase = v1alpha1.PhasePending
		s.runs[r.Name] = r
		s.order = append(s.order, r.Name)
	}
	for _, n := range p.cancel {
		s.runs[n].Spec.CancelRequested = true
	}
	for k, v := range p.retryAt {
		s.notBefore[k] = v
	}
	s.wf.Status = p.status
	return p
}

// settle decides until the status stops changing.
func (s *sim) settle() {
	s.t.Helper()
	for range 100 {
		before := s.wf.Status.DeepCopy()
		s.decide()
		if equality.Semantic.DeepEqual(before, &s.wf.Status) {
			return
		}
	}
	s.t.Fatal("decide does not settle")
}

// pending returns the Runs not yet ended, in creation order.
func (s *sim) pending() []*v1alpha1.Run {
	var out []*v1alpha1.Run
	for _, n := range s.order {
		if r := s.runs[n]; !r.Status.Phase.Terminal() {
			out = append(out, r)
		}
	}
	return out
}

// end ends run as runtimed would, on its pinned pod or a new one.
func (s *sim) end(r *v1alpha1.Run, phase v1alpha1.Phase, exit int32, outputs map[string]string, env ...v1alpha1.EnvVar) {
	if r.Status.AssignedPodUID == "" {
		if p := r.Spec.Placement; p != nil && p.PodUID != "" {
			r.Status.AssignedPodUID = p.PodUID
		} else {
			s.pods++
			r.Status.AssignedPodUID = fmt.Sprintf("pod-%d", s.pods)
		}
		r.Status.AssignedPod = "p-" + r.Status.AssignedPodUID
	}
	r.Status.Phase, r.Status.ExitCode, r.Status.Outputs, r.Status.Env = phase, &exit, outputs, env
	if phase == v1alpha1.PhaseFailed && r.Status.Reason == "" {
		r.Status.Reason = "NonZeroExit"
	}
}

// runAll ends every pending Run Succeeded (the ones f picks otherwise),
// settling between, until none is pending.
func (s *sim) runAll(f func(r *v1alpha1.Run) bool) {
	s.t.Helper()
	for range 1000 {
		s.settle()
		p := s.pending()
		if len(p) == 0 {
			return
		}
		for _, r := range p {
			if f == nil || !f(r) {
				s.end(r, v1alpha1.PhaseSucceeded, 0, nil)
			}
		}
	}
	s.t.Fatal("runs keep coming")
}

func (s *sim) job(name string) *v1alpha1.JobStatus {
	for i := range s.wf.Status.Jobs {
		if s.wf.Status.Jobs[i].Name == name {
			return &s.wf.Status.Jobs[i]
		}
	}
	s.t.Fatalf("no job %q in %v", name, s.phases())
	return nil
}

func (s *sim) phases() string {
	var b strings.Builder
	for _, j := range s.wf.Status.Jobs {
		fmt.Fprintf(&b, "%s=%s[", j.Name, j.Phase)
		for _, st := range j.Steps {
			fmt.Fprintf(&b, "%s ", st.Phase)
		}
		b.WriteString("] ")
	}
	return b.String()
}

func envOf(r *v1alpha1.Run, k string) (string, bool) {
	for _, e := range r.Spec.Env {
		if e.Name == k {
			return e.Value, true
		}
	}
	return "", false
}

func run(script string) v1alpha1.Step { return v1alpha1.Step{Run: script} }

// pipeline is the 3-job pipeline: build → test (a matrix of 3)
// → publish, and a report job that runs always.
func pipeline() v1alpha1.WorkflowRunSpec {
	axis := []apiextensionsv1.JSON{{Raw: []byte(`"a"`)}, {Raw: []byte(`"b"`)}, {Raw: []byte(`"c"`)}}
	return v1alpha1.WorkflowRunSpec{
		Env: []v1alpha1.EnvVar{{Name: "STAGE", Value: "ci"}},
		Jobs: []v1alpha1.Job{
			{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{run("make"), {ID: "v", Run: "echo version=1 >> $GITHUB_OUTPUT"}},
				Outputs: []v1alpha1.NameValue{{Name: "version", Value: "${{ steps.v.outputs.version }}"}}},
			{ID: "test", Needs: []string{"build"}, Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "shard", Values: axis}}}},
				Steps:   []v1alpha1.Step{{ID: "t", Run: `test "${{ matrix.shard }}" "${{ needs.build.outputs.version }}"`}},
				Outputs: []v1alpha1.NameValue{{Name: "passed", Value: "${{ steps.t.outputs.passed }}"}}},
			{ID: "publish", Needs: []string{"test"}, Steps: []v1alpha1.Step{run(`echo "${{ needs.test.outputs.passed }}"`)}},
			{ID: "report", Needs: []string{"publish"}, If: "always()", Steps: []v1alpha1.Step{run("echo report")}},
		},
	}
}

func TestPipelineSucceeds(t *testing.T) {
	s := newSim(t, pipeline())
	s.settle()
	if s.wf.Status.Phase != v1alpha1.WorkflowRunning || len(s.wf.Status.Jobs) != 6 {
		t.Fatalf("after start: %s %s", s.wf.Status.Phase, s.phases())
	}
	// Only build's first step runs: nothing else is ready.
	p := s.pending()
	if len(p) != 1 || p[0].Labels[LabelJob] != "build" || p[0].Spec.Placement.PodUID != "" {
		t.Fatalf("first runs: %v", s.order)
	}
	ws := p[0].Spec.Placement.Workspace
	s.end(p[0], v1alpha1.PhaseSucceeded, 0, nil, v1alpha1.EnvVar{Name: "FROM_STEP1", Value: "yes"})
	s.settle()
	p = s.pending()
	// The second step is pinned to the first's pod, in its workspace,
	// and sees what the first wrote to $GITHUB_ENV.
	if len(p) != 1 || p[0].Spec.Placement.PodUID != "pod-1" || p[0].Spec.Placement.Workspace != ws || !p[0].Spec.Placement.ReleaseWorkspace {
		t.Fatalf("second step: %+v", p[0].Spec.Placement)
	}
	if v, _ := envOf(p[0], "FROM_STEP1"); v != "yes" {
		t.Errorf("GITHUB_ENV not carried: %v", p[0].Spec.Env)
	}
	if v, _ := envOf(p[0], "STAGE"); v != "ci" {
		t.Errorf("workflow env: %v", p[0].Spec.Env)
	}
	s.end(p[0], v1alpha1.PhaseSucceeded, 0, map[string]string{"version": "1"})
	s.settle()
	p = s.pending()
	if len(p) != 3 {
		t.Fatalf("the matrix of 3 after build: %s", s.phases())
	}
	for i, r := range p {
		shard := string(rune('a' + i))
		if r.Spec.Source == nil || r.Spec.Source.Inline == nil || strings.Contains(r.Spec.Source.Inline.Text, "${{") {
			t.Fatalf("test's script: %+v", r.Spec.Source)
		}
		if got := r.Spec.Source.Inline.Text; got != `test "${STOKE_EXPR_0}" "${STOKE_EXPR_1}"` {
			t.Errorf("script %q", got)
		}
		if v, _ := envOf(r, "STOKE_EXPR_0"); v != shard {
			t.Errorf("matrix value: %q, want %q", v, shard)
		}
		if v, _ := envOf(r, "STOKE_EXPR_1"); v != "1" {
			t.Errorf("needs output: %q", v)
		}
		s.end(r, v1alpha1.PhaseSucceeded, 0, map[string]string{"passed": "yes-" + shard})
	}
	s.runAll(nil)
	if s.wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("phase %s: %s", s.wf.Status.Phase, s.phases())
	}
	pub := s.runs[s.job("publish").Steps[0].Run]
	if v, _ := envOf(pub, "STOKE_EXPR_0"); !strings.HasPrefix(v, "yes-") {
		t.Errorf("publish saw needs.test.outputs.passed = %q", v)
	}
	if s.job("build").Outputs[0].Value != "1" {
		t.Errorf("build's outputs: %v", s.job("build").Outputs)
	}
	if got := s.job("report").Phase; got != v1alpha1.JobSucceeded {
		t.Errorf("report: %s", got)
	}
}

func TestPipelineFailsInTheRightJob(t *testing.T) {
	s := newSim(t, pipeline())
	s.runAll(func(r *v1alpha1.Run) bool {
		if r.Labels[LabelJob] == "test" {
			if v, _ := envOf(r, "STOKE_EXPR_0"); v == "b" {
				s.end(r, v1alpha1.PhaseFailed, 1, nil)
				return true
			}
		}
		return false
	})
	want := map[string]v1alpha1.JobPhase{"build": v1alpha1.JobSucceeded, "test (b)": v1alpha1.JobFailed,
		"publish": v1alpha1.JobSkipped, "report": v1alpha1.JobSucceeded}
	for name, ph := range want {
		if got := s.job(name).Phase; got != ph {
			t.Errorf("%s: %s, want %s (%s)", name, got, ph, s.phases())
		}
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowFailed || !strings.Contains(s.wf.Status.Message, "test (b)") {
		t.Errorf("workflow: %s %q", s.wf.Status.Phase, s.wf.Status.Message)
	}
	if ex := s.job("test (b)").Steps[0].ExitCode; ex == nil || *ex != 1 {
		t.Errorf("the failed step's exit code: %v", ex)
	}
}

func TestFailFastCancelsTheOtherInstances(t *testing.T) {
	s := newSim(t, pipeline())
	s.runAll(func(r *v1alpha1.Run) bool {
		if r.Labels[LabelJob] != "test" {
			return false
		}
		v, _ := envOf(r, "STOKE_EXPR_0")
		switch {
		case v == "a":
			s.end(r, v1alpha1.PhaseFailed, 1, nil)
		case r.Spec.CancelRequested:
			s.end(r, v1alpha1.PhaseCancelled, -1, nil)
		}
		return true // b and c stay running until cancelled
	})
	for _, n := range []string{"test (b)", "test (c)"} {
		if got := s.job(n).Phase; got != v1alpha1.JobCancelled {
			t.Errorf("%s: %s", n, got)
		}
	}
}

func TestCancelMidRun(t *testing.T) {
	s := newSim(t, pipeline())
	s.settle()
	build := s.pending()[0]
	s.wf.Spec.CancelRequested = true
	p := s.decide()
	if !slices.Contains(p.cancel, build.Name) || !build.Spec.CancelRequested {
		t.Fatalf("the running step was not cancelled: %v", p.cancel)
	}
	if got := s.job("test (a)").Phase; got != v1alpha1.JobSkipped {
		t.Errorf("a pending job: %s", got)
	}
	if s.wf.Status.Phase.Terminal() {
		t.Fatal("ended before its running step did")
	}
	s.end(build, v1alpha1.PhaseCancelled, -1, nil)
	s.settle()
	if s.wf.Status.Phase != v1alpha1.WorkflowCancelled || s.job("build").Phase != v1alpha1.JobCancelled {
		t.Fatalf("%s %s", s.wf.Status.Phase, s.phases())
	}
	if st := s.job("build").Steps; st[0].Phase != v1alpha1.JobCancelled || st[1].Phase.Terminal() == false {
		t.Errorf("steps %v", st)
	}
	for _, r := range s.runs {
		if !r.Status.Phase.Terminal() && r.Labels[LabelStep] != "cleanup" {
			t.Errorf("left running: %s", r.Name)
		}
	}
}

// A restarted controller decides from the status it wrote and the Runs
// it sees: the same Run names, so nothing starts twice.
func TestRestartAdoptsTheStepRuns(t *testing.T) {
	s := newSim(t, pipeline())
	s.settle()
	s.end(s.pending()[0], v1alpha1.PhaseSucceeded, 0, nil)
	// The status write of the decision that created step 2 was lost.
	lost := s.wf.Status.DeepCopy()
	s.settle()
	created := len(s.order)
	s.wf.Status = *lost
	s.settle()
	if len(s.order) != created {
		t.Fatalf("a restart created %v", s.order[created:])
	}
	if s.job("build").Steps[1].Run == "" {
		t.Fatal("the step Run was not adopted")
	}
}

func TestJobRetriedWholeWhenItsPodGoes(t *testing.T) {
	spec := v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 2},
		Steps: []v1alpha1.Step{run("one"), run("two")}}}}
	s := newSim(t, spec)
	s.settle()
	s.end(s.pending()[0], v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	two := s.pending()[0]
	two.Status.Reason = "Unschedulable" // its pod went away
	s.end(two, v1alpha1.PhaseFailed, -1, nil)
	s.settle()
	js := s.job("j")
	if js.Attempt != 2 || js.Phase != v1alpha1.JobPending {
		t.Fatalf("after the pod went: attempt %d %s", js.Attempt, js.Phase)
	}
	// The backoff passes; the attempt starts on a new pod, from step one.
	s.now = s.notBefore["j"]
	s.settle()
	p := s.pending()
	if len(p) != 1 || p[0].Spec.Placement.PodUID != "" || !strings.Contains(p[0].Name, "-a2-s0-") {
		t.Fatalf("attempt 2 starts with %v", s.order)
	}
	s.runAll(nil)
	if s.wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("%s", s.phases())
	}

	// Without a retry policy the job fails.
	spec.Jobs[0].RetryPolicy = nil
	s = newSim(t, spec)
	s.settle()
	first := s.pending()[0]
	first.Status.Reason = "PodGone"
	s.end(first, v1alpha1.PhaseFailed, -1, nil)
	s.settle()
	if s.job("j").Phase != v1alpha1.JobFailed || s.wf.Status.Phase != v1alpha1.WorkflowFailed {
		t.Fatalf("%s", s.phases())
	}
}

func TestJobTimeout(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", TimeoutMinutes: 1, Steps: []v1alpha1.Step{run("sleep 100")}}}})
	p := s.decide()
	if p.wake != t0.Add(time.Minute) {
		t.Fatalf("wake %v", p.wake)
	}
	r := s.pending()[0]
	s.now = t0.Add(time.Minute)
	s.decide()
	if !r.Spec.CancelRequested {
		t.Fatal("not cancelled at its timeout")
	}
	s.end(r, v1alpha1.PhaseCancelled, -1, nil)
	s.settle()
	if js := s.job("j"); js.Phase != v1alpha1.JobFailed || !strings.Contains(js.Message, "timeout") {
		t.Fatalf("%s %q", js.Phase, js.Message)
	}
}

func TestStepIfAndContinueOnError(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", Steps: []v1alpha1.Step{
		{ID: "a", Run: "exit 1", ContinueOnError: true},
		{ID: "b", Run: "exit 1"},
		{ID: "c", Run: "skipped: b failed"},
		{ID: "d", If: "failure()", Run: "runs: b failed"},
		{ID: "e", If: "${{ always() && steps.a.outcome == 'failure' }}", Run: "runs"},
	}}}})
	s.runAll(func(r *v1alpha1.Run) bool {
		if strings.HasPrefix(r.Spec.Source.Inline.Text, "exit 1") {
			s.end(r, v1alpha1.PhaseFailed, 1, nil)
			return true
		}
		return false
	})
	st := s.job("j").Steps
	got := []string{}
	for _, x := range st {
		got = append(got, x.Outcome+"/"+x.Conclusion)
	}
	want := []string{"failure/success", "failure/failure", "skipped/skipped", "success/success", "success/success"}
	if !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
	if s.job("j").Phase != v1alpha1.JobFailed {
		t.Errorf("job %s", s.job("j").Phase)
	}
	// The last step released the workspace: no cleanup Run.
	for _, r := range s.runs {
		if r.Labels[LabelStep] == "cleanup" {
			t.Errorf("a cleanup Run although the last step ran: %s", r.Name)
		}
	}
}

func TestCleanupRunWhenTheLastStepIsSkipped(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", Steps: []v1alpha1.Step{run("a"), {Run: "b", If: "false"}}}}})
	s.runAll(nil)
	var cleanup *v1alpha1.Run
	for _, r := range s.runs {
		if r.Labels[LabelStep] == "cleanup" {
			cleanup = r
		}
	}
	if cleanup == nil || !cleanup.Spec.Placement.ReleaseWorkspace || cleanup.Spec.Placement.PodUID != "pod-1" {
		t.Fatalf("cleanup %+v", cleanup)
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Errorf("%s", s.phases())
	}
}

func TestMaxParallel(t *testing.T) {
	spec := pipeline()
	spec.Jobs = spec.Jobs[1:2]
	spec.Jobs[0].Needs = nil
	spec.Jobs[0].Strategy.MaxParallel = 1
	s := newSim(t, spec)
	s.settle()
	if n := len(s.pending()); n != 1 {
		t.Fatalf("%d instances run at once with maxParallel 1", n)
	}
}

func TestArtifactStepCopiesThroughItsHoldRun(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", Steps: []v1alpha1.Step{
		{Uses: usesUpload, With: []v1alpha1.NameValue{{Name: "name", Value: "bin-${{ workflow.name }}"}, {Name: "path", Value: "out"}}},
		run("after"),
	}}}})
	s.settle()
	hold := s.pending()[0]
	if !slices.Equal(hold.Spec.Mode.Task.Args, artifact.HoldCommand()) || hold.Spec.Placement.Workspace == "" {
		t.Fatalf("the artifact step's Run: %+v", hold.Spec)
	}
	if p := s.decide(); len(p.artifacts) != 0 {
		t.Fatal("a copy before the Run runs")
	}
	hold.Status.Phase, hold.Status.AssignedPodUID = v1alpha1.PhaseRunning, "pod-9"
	p := s.decide()
	if len(p.artifacts) != 1 || !p.artifacts[0].Upload || p.artifacts[0].With["name"] != "bin-ci" || p.artifacts[0].Run != hold.Name {
		t.Fatalf("copy %+v", p.artifacts)
	}
	// The copy is done and released the hold, which ended with it.
	s.arts[hold.Name] = artifactResult{message: "stored 1 file"}
	if p := s.decide(); len(p.artifacts) != 0 {
		t.Fatal("the copy again")
	}
	s.end(hold, v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	if st := s.job("j").Steps[0]; st.Phase != v1alpha1.JobSucceeded || st.Message != "stored 1 file" {
		t.Fatalf("step %+v", st)
	}
	if next := s.pending(); len(next) != 1 || next[0].Spec.Placement.PodUID != "pod-9" {
		t.Fatalf("the next step is not pinned to the hold's pod: %v", next)
	}
}

// A copy that fails releases its hold Run, which ends Failed, before the
// copy's result is back on the controller's loop: the step waits for
// that result and says why the copy failed, not that the hold exited 1
// (the Kubernetes e2e's artifact-escapes case, which saw the Run's end
// first).
func TestArtifactStepWaitsForItsCopysResult(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "j", Steps: []v1alpha1.Step{
		{Uses: usesUpload, With: []v1alpha1.NameValue{{Name: "name", Value: "x"}, {Name: "path", Value: "../../etc"}}},
	}}}})
	s.settle()
	hold := s.pending()[0]
	hold.Status.Phase, hold.Status.AssignedPodUID = v1alpha1.PhaseRunning, "pod-9"
	if p := s.decide(); len(p.artifacts) != 1 {
		t.Fatalf("copy %+v", p.artifacts)
	}
	s.copying[hold.Name] = true
	s.end(hold, v1alpha1.PhaseFailed, 1, nil)
	hold.Status.Message = "exited with status 1"
	s.settle()
	if st := s.job("j").Steps[0]; st.Phase.Terminal() {
		t.Fatalf("the step ended before its copy's result: %+v", st)
	}
	delete(s.copying, hold.Name)
	s.arts[hold.Name] = artifactResult{err: fmt.Errorf("with.path: must stay in the workspace")}
	s.settle()
	if st := s.job("j").Steps[0]; st.Phase != v1alpha1.JobFailed || !strings.Contains(st.Message, "with.path") {
		t.Fatalf("step %+v", st)
	}
}
