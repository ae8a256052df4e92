package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for kind, obj := range map[string]runtime.Object{
		KindRun: &Run{}, KindRun + "List": &RunList{},
		KindRuntime: &Runtime{}, KindRuntime + "List": &RuntimeList{},
		KindFunction: &Function{}, KindFunction + "List": &FunctionList{},
		KindWorkflowRun: &WorkflowRun{}, KindWorkflowRun + "List": &WorkflowRunList{},
		KindWorkflow: &Workflow{}, KindWorkflow + "List": &WorkflowList{},
	} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if want := SchemeGroupVersion.WithKind(kind); len(gvks) != 1 || gvks[0] != want {
			t.Fatalf("%T registered as %v, want %v", obj, gvks, want)
		}
	}
}
