package workflow

import (
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// BenchmarkDecideFanOut is the controller's CPU for the decision on the
// critical path of BenchmarkUpWorkflowFanOut100's edges: start's step Run
// has ended, and the decision ends start and builds the step Runs of the
// 98 mid instances that need it (the store's creates are not in it).
// With the layout kept (as the controller keeps it) and without.
func BenchmarkDecideFanOut(b *testing.B) {
	vals := make([]apiextensionsv1.JSON, 98)
	for k := range vals {
		vals[k] = apiextensionsv1.JSON{Raw: []byte(fmt.Sprint(k))}
	}
	spec := v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "start", RunsOn: "wide", Steps: []v1alpha1.Step{run("true")}},
		{ID: "mid", Needs: []string{"start"}, RunsOn: "wide", Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "k", Values: vals}}}}, Steps: []v1alpha1.Step{run("true")}},
		{ID: "end", Needs: []string{"mid"}, RunsOn: "wide", Steps: []v1alpha1.Step{run("true")}},
	}}
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "fan", Namespace: "default", UID: "wf-uid", Generation: 1}, Spec: spec}
	runs := map[string]*v1alpha1.Run{}
	ws := &v1alpha1.WorkflowSpec{Jobs: wf.Spec.Jobs}
	world := func(l *layout) *world {
		return &world{now: t0, wf: wf, spec: ws, layout: l,
			run:       func(name string) (*v1alpha1.Run, bool) { r, ok := runs[name]; return r, ok },
			server:    func(string) string { return "bash" },
			artifact:  func(string) (artifactResult, bool) { return artifactResult{}, false },
			copying:   func(string) bool { return false },
			notBefore: func(string) time.Time { return time.Time{} }}
	}
	p := decide(world(nil))
	if len(p.create) != 1 {
		b.Fatalf("the first decision creates %d Runs, want start's one", len(p.create))
	}
	r := p.create[0].DeepCopy()
	code := int32(0)
	r.Status = v1alpha1.RunStatus{Phase: v1alpha1.PhaseSucceeded, ExitCode: &code, AssignedPod: "p", AssignedPodUID: "p-uid"}
	runs[r.Name] = r
	wf.Status = p.status
	for _, kept := range []bool{true, false} {
		b.Run(fmt.Sprintf("kept=%v", kept), func(b *testing.B) {
			var l *layout
			if kept {
				l = newLayout(ws, nil)
			}
			for b.Loop() {
				if p := decide(world(l)); len(p.create) != 98 {
					b.Fatalf("the decision creates %d Runs, want 98", len(p.create))
				}
			}
		})
	}
}
