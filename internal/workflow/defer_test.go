package workflow_test

import (
	"slices"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/workflow"
)

// TestAFanOutIsPlacedOnceCreated: the step Runs a decision creates
// together (a matrix of 3 that needs a) are named to Config.Defer before
// the first create, and released only once every one of them is stored;
// a decision that creates one step Run (a's) defers nothing.
func TestAFanOutIsPlacedOnceCreated(t *testing.T) {
	type call struct {
		keys            []string
		storedAtRelease int
		releases        int
	}
	var mu sync.Mutex
	var calls []*call
	var e *env
	deferFn := func(keys []informer.Key) func() {
		c := &call{}
		for _, k := range keys {
			c.keys = append(c.keys, k.Name)
		}
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		return func() {
			n := 0
			for _, k := range keys {
				if _, err := e.st.Runs().Get(e.ctx, k.Namespace, k.Name); err == nil {
					n++
				}
			}
			mu.Lock()
			c.storedAtRelease = n
			c.releases++
			mu.Unlock()
		}
	}
	e = newEnvDeferring(t, t.TempDir(), deferFn)
	vals := []apiextensionsv1.JSON{{Raw: []byte("1")}, {Raw: []byte("2")}, {Raw: []byte("3")}}
	wf := &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"}, Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{
		{ID: "a", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "true"}}},
		{ID: "m", RunsOn: "bash", Needs: []string{"a"}, Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "k", Values: vals}}}},
			Steps: []v1alpha1.Step{{Run: "true"}}},
	}}}
	if _, err := e.st.WorkflowRuns().Create(e.ctx, wf); err != nil {
		t.Fatal(err)
	}
	e.until("a's step Run", func() bool { return len(e.stepRuns()) == 1 })
	e.finish(e.stepRuns()[0].Name, "p1", v1alpha1.PhaseSucceeded, nil)
	e.until("m's three step Runs", func() bool { return len(e.stepRuns()) == 4 })
	var mids []string
	for _, r := range e.stepRuns() {
		if r.Labels[workflow.LabelJob] == "m" {
			mids = append(mids, r.Name)
		}
	}
	e.until("the deferral released", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 1 && calls[0].releases > 0
	})
	mu.Lock()
	defer mu.Unlock()
	c := calls[0]
	slices.Sort(c.keys)
	slices.Sort(mids)
	if !slices.Equal(c.keys, mids) {
		t.Fatalf("deferred %v, want m's step Runs %v (and nothing for a's single step Run)", c.keys, mids)
	}
	if c.storedAtRelease != 3 || c.releases != 1 {
		t.Fatalf("released once with %d of 3 stored (released %d times), want once, with all 3", c.storedAtRelease, c.releases)
	}
}
