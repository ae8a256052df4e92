package workflow

import (
	"slices"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

func hashSpec() v1alpha1.WorkflowRunSpec {
	return v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{
		run("make"),
		{ID: "cache", If: "hashFiles('go.sum') != ''", Run: `echo "${{ hashFiles('**/go.sum') }}"`,
			Env: []v1alpha1.EnvVar{{Name: "KEY", Value: "go-${{ hashFiles('go.sum') }}"}}},
		{If: "hashFiles('none') != ''", Run: "echo never"},
		run("echo last"),
	}}}}
}

// A step whose fields call hashFiles waits for its hash Run (Stoke's own
// program, on the job's pod, in its workspace, the patterns as
// arguments), then runs with the answers; a restarted controller finds
// the hash Run by its name.
func TestHashFilesRunsBeforeItsStep(t *testing.T) {
	s := newSim(t, hashSpec())
	s.settle()
	s.end(s.pending()[0], v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	p := s.pending()
	if len(p) != 1 || !strings.Contains(p[0].Name, "-h1-") {
		t.Fatalf("after step 0: %v", s.order)
	}
	h := p[0]
	if want := []string{"stoke", "hash-files", "go.sum", "**/go.sum"}; !slices.Equal(h.Spec.Mode.Task.Args, want) {
		t.Errorf("hash Run args = %q, want %q", h.Spec.Mode.Task.Args, want)
	}
	if h.Spec.Placement.PodUID != "pod-1" || h.Spec.Placement.Workspace == "" || h.Spec.Placement.ReleaseWorkspace || h.Spec.Source != nil {
		t.Errorf("hash Run placement %+v, source %v", h.Spec.Placement, h.Spec.Source)
	}
	if st := s.job("build").Steps[1]; st.Phase != v1alpha1.JobPending || st.Run != "" {
		t.Errorf("step 1 before its hash: %+v", st)
	}
	// A restarted controller (a fresh decision over the same Runs) makes
	// no second hash Run.
	s.wf.Status.Jobs[0].Steps[1] = v1alpha1.StepStatus{Name: s.wf.Status.Jobs[0].Steps[1].Name, Phase: v1alpha1.JobPending}
	if p := s.decide(); len(p.create) != 0 {
		t.Fatalf("a second decision makes %s", p.create[0].Name)
	}
	s.end(h, v1alpha1.PhaseSucceeded, 0, map[string]string{"h0": "aaa", "h1": "bbb"})
	s.settle()
	step := s.pending()[0]
	if v, _ := envOf(step, "KEY"); v != "go-aaa" {
		t.Errorf("KEY = %q", v)
	}
	if v, _ := envOf(step, "STOKE_EXPR_0"); v != "bbb" {
		t.Errorf("run's expression = %q", v)
	}
	s.end(step, v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	h2 := s.pending()[0]
	if want := []string{"stoke", "hash-files", "none"}; !strings.Contains(h2.Name, "-h2-") || !slices.Equal(h2.Spec.Mode.Task.Args, want) {
		t.Fatalf("step 2's hash Run: %s %q", h2.Name, h2.Spec.Mode.Task.Args)
	}
	// Nothing matched: '' and the step's if is false.
	s.end(h2, v1alpha1.PhaseSucceeded, 0, map[string]string{"h0": ""})
	s.runAll(nil)
	js := s.job("build")
	if js.Phase != v1alpha1.JobSucceeded || js.Steps[2].Phase != v1alpha1.JobSkipped || js.Steps[3].Phase != v1alpha1.JobSucceeded {
		t.Errorf("end: %s", s.phases())
	}
}

// A hash Run that fails fails its step, saying why; the job fails.
func TestHashFilesFailureFailsTheStep(t *testing.T) {
	s := newSim(t, hashSpec())
	s.settle()
	s.end(s.pending()[0], v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	h := s.pending()[0]
	h.Status.Message = "hashFiles: openat bad/out: path escapes from parent"
	s.end(h, v1alpha1.PhaseFailed, 1, nil)
	s.runAll(nil)
	js := s.job("build")
	if js.Phase != v1alpha1.JobFailed || js.Steps[1].Phase != v1alpha1.JobFailed || !strings.Contains(js.Steps[1].Message, "path escapes") {
		t.Errorf("end: %s; step 1 %+v", s.phases(), js.Steps[1])
	}
	if js.Steps[1].Run != "" {
		t.Errorf("the step ran: %s", js.Steps[1].Run)
	}
}

// On a python Runtime there is no shell-free way to run stoke: refused.
func TestHashFilesNeedsBash(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "build", RunsOn: "py", Steps: []v1alpha1.Step{
		{Shell: "python", Run: "print(1)", Env: []v1alpha1.EnvVar{{Name: "KEY", Value: "${{ hashFiles('x') }}"}}},
	}}}})
	s.server = "python"
	s.runAll(nil)
	if st := s.job("build").Steps[0]; st.Phase != v1alpha1.JobFailed || !strings.Contains(st.Message, "needs a bash Runtime") || len(s.order) != 0 {
		t.Errorf("step 0: %+v; runs %v", st, s.order)
	}
}
