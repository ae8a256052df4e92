package standalone_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/workflow"
)

// awaitWorkflowRun waits, on the store's own watch, until the WorkflowRun
// name satisfies ok.
func (p *plane) awaitWorkflowRun(t testing.TB, name, what string, ok func(*v1alpha1.WorkflowRun) bool) *v1alpha1.WorkflowRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	inf := informer.New(p.Store().WorkflowRuns(), informer.Options{})
	changed := make(chan struct{}, 1)
	inf.AddEventHandler(informer.HandlerFuncs[*v1alpha1.WorkflowRun]{
		AddFunc:    func(*v1alpha1.WorkflowRun) { poke(changed) },
		UpdateFunc: func(_, _ *v1alpha1.WorkflowRun) { poke(changed) },
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = inf.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for {
		if wf, found := inf.Get("default", name); found && ok(wf) {
			return wf
		}
		select {
		case <-changed:
		case <-ctx.Done():
			wf, _ := inf.Get("default", name)
			b, _ := json.MarshalIndent(wf, "", " ")
			t.Fatalf("workflowrun %s never became %s: %s", name, what, b)
		}
	}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// A WorkflowRun on real pods with real bash: a job's steps share one
// workspace on one pod (the second reads the file the first wrote, and
// what it wrote to $GITHUB_ENV), its $GITHUB_OUTPUT reaches a matrix job
// through needs, an artifact it uploads is downloaded into the matrix
// instances' workspaces, and an expression in a script arrives as an
// environment variable, never as source.
func TestWorkflowOnRealPods(t *testing.T) {
	p := start(t, runtimeOf("bash", 2, 8))
	wf := &v1alpha1.WorkflowRun{
		ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"},
		Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
			{ID: "build", RunsOn: "bash", Outputs: []v1alpha1.NameValue{{Name: "v", Value: "${{ steps.check.outputs.v }}"}},
				Steps: []v1alpha1.Step{
					{Run: "mkdir -p dist && echo built > dist/out.txt\necho FROM_ONE=yes >> \"$GITHUB_ENV\""},
					{ID: "check", Run: "test \"$(cat dist/out.txt)\" = built\ntest \"$FROM_ONE\" = yes\necho v=1.2 >> \"$GITHUB_OUTPUT\""},
					{Uses: "upload-artifact", With: []v1alpha1.NameValue{{Name: "name", Value: "bin"}, {Name: "path", Value: "dist/"}}},
				}},
			{ID: "test", Needs: []string{"build"}, RunsOn: "bash",
				Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "x", Values: []apiextensionsv1.JSON{
					{Raw: []byte(`"a"`)}, {Raw: []byte(`"$(touch pwned)"`)}}}}}},
				// The matrix value is text for the script, never code.
				Steps: []v1alpha1.Step{
					{Uses: "download-artifact", With: []v1alpha1.NameValue{{Name: "name", Value: "bin"}}},
					{Run: `test "${{ needs.build.outputs.v }}" = 1.2 && echo "${{ matrix.x }}" && test ! -e pwned && test "$(cat out.txt)" = built`},
				}},
		}},
	}
	if _, err := p.Store().WorkflowRuns().Create(context.Background(), wf); err != nil {
		t.Fatal(err)
	}
	done := p.awaitWorkflowRun(t, "ci", "ended", func(wf *v1alpha1.WorkflowRun) bool { return wf.Status.Phase.Terminal() })
	if done.Status.Phase != v1alpha1.WorkflowSucceeded {
		b, _ := json.MarshalIndent(done.Status, "", " ")
		t.Fatalf("%s", b)
	}
	build := done.Status.Jobs[0]
	if build.PodUID == "" || build.Outputs[0].Value != "1.2" {
		t.Errorf("build: pod %q outputs %v", build.PodUID, build.Outputs)
	}
	for _, st := range build.Steps {
		run, err := p.GetRun(context.Background(), "default", st.Run)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status.AssignedPodUID != build.PodUID {
			t.Errorf("step %s ran on %s, the job on %s", st.Name, run.Status.AssignedPodUID, build.PodUID)
		}
		if run.Labels[workflow.LabelWorkflowRun] != "ci" || run.Labels[workflow.LabelJob] != "build" {
			t.Errorf("labels %v", run.Labels)
		}
	}
	names := []string{}
	for _, j := range done.Status.Jobs {
		names = append(names, j.Name+"="+string(j.Phase))
	}
	if got := strings.Join(names, " "); got != "build=Succeeded test (a)=Succeeded test ($(touch pwned))=Succeeded" {
		t.Errorf("jobs: %s", got)
	}
}
