package workflow

import (
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// A working-directory with expressions is evaluated in the step's context
// (here a matrix value) and passed as the cd's argument; one that
// evaluates to a path leaving the workspace fails its step, saying so,
// and makes no Run.
func TestWorkingDirectoryExpressions(t *testing.T) {
	spec := v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "build", RunsOn: "bash",
		Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "dir", Values: []apiextensionsv1.JSON{{Raw: []byte(`"svc/a"`)}, {Raw: []byte(`"../out"`)}}}}}},
		Steps:    []v1alpha1.Step{{Run: "make", WorkingDirectory: "${{ matrix.dir }}"}},
	}}}
	s := newSim(t, spec)
	s.settle()
	p := s.pending()
	if len(p) != 1 {
		t.Fatalf("Runs made: %d (%s), want 1", len(p), s.phases())
	}
	args := p[0].Spec.Mode.Task.Args
	if i := slices.Index(args, "stoke-step"); i < 0 || i+1 >= len(args) || args[i+1] != "svc/a" {
		t.Errorf("step args = %q, want the evaluated directory svc/a after stoke-step", args)
	}
	var failed *v1alpha1.JobStatus
	for i := range s.wf.Status.Jobs {
		if js := &s.wf.Status.Jobs[i]; js.Phase == v1alpha1.JobFailed {
			failed = js
		}
	}
	if failed == nil || len(failed.Steps) == 0 || !strings.Contains(failed.Steps[0].Message, "must not contain '..'") {
		t.Fatalf("the ../out instance: %s, want its step failed on the '..'", s.phases())
	}
}
