package printer

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// describe workflowrun shows the DAG: each job instance under its job,
// with what it needs, and each step's phase, exit code and duration.
func TestDescribeWorkflowRun(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := func(s int) *metav1.Time { m := metav1.NewTime(t0.Add(time.Duration(s) * time.Second)); return &m }
	code0, code1 := int32(0), int32(1)
	w := &v1alpha1.WorkflowRun{}
	w.Name, w.Namespace = "ci", "default"
	w.Spec.Jobs = []v1alpha1.Job{
		{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "make"}}},
		{ID: "test", Needs: []string{"build"}, RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "t"}}},
		{ID: "publish", Needs: []string{"test"}, RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "p"}}},
	}
	w.Status = v1alpha1.WorkflowRunStatus{Phase: v1alpha1.WorkflowFailed, Reason: "JobFailed", StartTime: at(0), CompletionTime: at(9),
		Jobs: []v1alpha1.JobStatus{
			{Name: "build", Job: "build", Phase: v1alpha1.JobSucceeded, Attempt: 1, Pod: "bash-0", StartTime: at(0), CompletionTime: at(2),
				Outputs: []v1alpha1.NameValue{{Name: "sha", Value: "abc"}},
				Steps:   []v1alpha1.StepStatus{{Name: "make", Phase: v1alpha1.JobSucceeded, ExitCode: &code0, StartTime: at(0), CompletionTime: at(2), Run: "ci-build-0-1-0"}}},
			{Name: "test (1)", Job: "test", Phase: v1alpha1.JobFailed, Attempt: 2, Pod: "bash-1", StartTime: at(3), CompletionTime: at(4),
				Steps: []v1alpha1.StepStatus{{ID: "t", Phase: v1alpha1.JobFailed, ExitCode: &code1, StartTime: at(3), CompletionTime: at(4), Message: "exit status 1"}}},
			{Name: "publish", Job: "publish", Phase: v1alpha1.JobSkipped},
		}}
	var b bytes.Buffer
	summaries := map[string]string{"ci-build-0-1-0": "## Build\nall green\n", "elsewhere": "not this run's"}
	if err := DescribeWorkflowRun(&b, w, summaries, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Each line with its indent, the alignment's spaces squeezed.
	var lines []string
	for _, l := range strings.Split(b.String(), "\n") {
		indent := len(l) - len(strings.TrimLeft(l, " "))
		lines = append(lines, strings.Repeat(" ", indent)+strings.Join(strings.Fields(l), " "))
	}
	out := strings.Join(lines, "\n")
	for _, want := range []string{
		"Phase: Failed",
		"Jobs:\n  build: Succeeded, pod bash-0, 2s\n    Output sha: abc\n    make: Succeeded, exit 0, 2s, run ci-build-0-1-0\n      Summary: ## Build\n",
		" all green\n  test (1):",
		"  test (1): Failed, needs build, attempt 2, pod bash-1, 1s\n    t: Failed, exit 1, 1s: exit status 1",
		"  publish: Skipped, needs test",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// A called Workflow's jobs are shown under the job that calls it, with
// their full names.
func TestDescribeWorkflowRunWithCalls(t *testing.T) {
	w := &v1alpha1.WorkflowRun{}
	w.Name, w.Namespace = "ci", "default"
	w.Spec.Jobs = []v1alpha1.Job{
		{ID: "call", Uses: "lib"},
		{ID: "after", Needs: []string{"call"}, RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "p"}}},
	}
	w.Status = v1alpha1.WorkflowRunStatus{Phase: v1alpha1.WorkflowSucceeded,
		Snapshot: &v1alpha1.WorkflowSnapshot{Called: []v1alpha1.CalledWorkflow{{Name: "lib", Spec: v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{
			{ID: "compile", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "make"}}},
			{ID: "pack", Needs: []string{"compile"}, RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "pack"}}},
		}}}}},
		Jobs: []v1alpha1.JobStatus{
			{Name: "call", Job: "call", Phase: v1alpha1.JobSucceeded, Outputs: []v1alpha1.NameValue{{Name: "artifact", Value: "pkg"}}},
			{Name: "call/compile", Job: "call/compile", Phase: v1alpha1.JobSucceeded, Pod: "bash-0", Steps: []v1alpha1.StepStatus{{Name: "make", Phase: v1alpha1.JobSucceeded}}},
			{Name: "call/pack", Job: "call/pack", Phase: v1alpha1.JobSucceeded, Pod: "bash-1", Steps: []v1alpha1.StepStatus{{Name: "pack", Phase: v1alpha1.JobSucceeded}}},
			{Name: "after", Job: "after", Phase: v1alpha1.JobSucceeded},
		}}
	var b bytes.Buffer
	if err := DescribeWorkflowRun(&b, w, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(b.String(), "\n") {
		indent := len(l) - len(strings.TrimLeft(l, " "))
		lines = append(lines, strings.Repeat(" ", indent)+strings.Join(strings.Fields(l), " "))
	}
	want := "Jobs:\n  call: Succeeded, calls Workflow lib\n    Output artifact: pkg\n" +
		"    call/compile: Succeeded, pod bash-0\n      make: Succeeded\n" +
		"    call/pack: Succeeded, needs compile, pod bash-1\n      pack: Succeeded\n" +
		"  after: Succeeded, needs call"
	if out := strings.Join(lines, "\n"); !strings.Contains(out, want) {
		t.Errorf("no\n%s\nin\n%s", want, out)
	}
}

func TestWorkflowRunTable(t *testing.T) {
	w := v1alpha1.WorkflowRun{}
	w.Name = "ci"
	w.Status.Phase = v1alpha1.WorkflowRunning
	w.Status.Jobs = []v1alpha1.JobStatus{{Name: "a", Phase: v1alpha1.JobSucceeded}, {Name: "b", Phase: v1alpha1.JobRunning}}
	var b bytes.Buffer
	p := New(&b, Table, false, func() time.Time { return time.Now() })
	if err := p.WorkflowRuns(&v1alpha1.WorkflowRunList{Items: []v1alpha1.WorkflowRun{w}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME WORKFLOW PHASE JOBS AGE" || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "ci - Running 1/2 ") {
		t.Fatalf("got\n%s", b.String())
	}
}
