package workflow

import (
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// A job that calls a Workflow (uses:) is not run by this engine yet: it
// fails, saying so, rather than succeeding with nothing run; the jobs
// needing it are skipped and an always() job still runs.
func TestWorkflowCallFailsClearly(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "call", Uses: "lib", With: []v1alpha1.NameValue{{Name: "v", Value: "1"}}},
		{ID: "after", RunsOn: "bash", Needs: []string{"call"}, Steps: []v1alpha1.Step{run("true")}},
		{ID: "report", RunsOn: "bash", Needs: []string{"call"}, If: "always()", Steps: []v1alpha1.Step{run("true")}},
	}})
	s.runAll(nil)
	call := s.job("call")
	if call.Phase != v1alpha1.JobFailed || !strings.Contains(call.Message, `calls Workflow "lib": Workflow calls are not run yet`) {
		t.Errorf("call: %s %q", call.Phase, call.Message)
	}
	if got := s.phases(); got != "call=Failed[] after=Skipped[Skipped ] report=Succeeded[Succeeded ] " {
		t.Errorf("phases %s", got)
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowFailed {
		t.Errorf("run %s", s.wf.Status.Phase)
	}
}
