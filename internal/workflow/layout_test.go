package workflow

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

func jobIDs(l *layout) []string {
	var out []string
	for _, it := range l.order {
		out = append(out, it.id)
	}
	return out
}

// TestLayoutKeptPerGeneration: the controller lays a WorkflowRun's spec
// out once per generation; a new generation (a spec edit) is laid out
// again, never served the old layout, and a spec read fresh from the
// Workflows in the store is not kept.
func TestLayoutKeptPerGeneration(t *testing.T) {
	m := &memo{}
	v1 := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("build"), needing(steps("test"), "build")}}
	a := m.layoutFor(1, v1, nil, false)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if got := m.layoutFor(1, v1, nil, false); got != a {
		t.Fatal("the same generation was laid out again")
	}

	v2 := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("build"), needing(steps("lint"), "build"), needing(steps("test"), "lint")}}
	b := m.layoutFor(2, v2, nil, false)
	if b == a {
		t.Fatal("a new generation got the old layout")
	}
	if got, want := jobIDs(b), []string{"build", "lint", "test"}; !slices.Equal(got, want) {
		t.Fatalf("generation 2's order: %v, want %v", got, want)
	}
	if b.jobs["lint"] == nil || b.jobs["test"].Needs[0] != "lint" {
		t.Fatalf("generation 2's jobs: %v", b.jobs)
	}

	// Read fresh (a run not started, its called Workflows just read):
	// laid out from what was read, and not kept.
	called := map[string]*v1alpha1.WorkflowSpec{"lib": {Jobs: []v1alpha1.Job{steps("inner")}}}
	v3 := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{calling("call", "lib")}}
	c := m.layoutFor(2, v3, called, true)
	if got, want := jobIDs(c), []string{"call", "call/inner", "call"}; !slices.Equal(got, want) {
		t.Fatalf("the fresh layout's order: %v, want %v", got, want)
	}
	called["lib"] = &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("other")}}
	if got, want := jobIDs(m.layoutFor(2, v3, called, true)), []string{"call", "call/other", "call"}; !slices.Equal(got, want) {
		t.Fatalf("a Workflow edited before the run started: order %v, want %v", got, want)
	}
	if d := m.layoutFor(2, v2, nil, false); d == b || d == c {
		t.Fatal("a layout was kept across a fresh read")
	}

	// A refusal is kept as the layout is.
	cyc := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{calling("call", "missing")}}
	if l := m.layoutFor(3, cyc, nil, false); l.err == nil {
		t.Fatal("a call of a Workflow the snapshot lacks was laid out")
	}
}

// TestStatusEqualIsSemantic: the fast comparison answers as the semantic
// one does, where reflect.DeepEqual alone would see a change (nil and
// empty, one instant in two locations) and make a needless write.
func TestStatusEqualIsSemantic(t *testing.T) {
	utc := metav1.NewTime(t0)
	local := metav1.NewTime(t0.In(time.FixedZone("X", 3600)))
	a := &v1alpha1.WorkflowRunStatus{Phase: v1alpha1.WorkflowRunning, StartTime: &utc, Jobs: []v1alpha1.JobStatus{{Name: "j", Steps: []v1alpha1.StepStatus{}}}}
	b := &v1alpha1.WorkflowRunStatus{Phase: v1alpha1.WorkflowRunning, StartTime: &local, Jobs: []v1alpha1.JobStatus{{Name: "j"}}}
	if !statusEqual(a, b) {
		t.Error("nil and empty steps, one instant in two locations: unequal")
	}
	if !statusEqual(a, a.DeepCopy()) {
		t.Error("a copy: unequal")
	}
	c := a.DeepCopy()
	c.Jobs[0].Phase = v1alpha1.JobRunning
	if statusEqual(a, c) {
		t.Error("a job's phase changed: equal")
	}
}
