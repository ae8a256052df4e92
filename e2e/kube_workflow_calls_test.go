package e2e

import (
	"context"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// kubeLib is a Workflow a WorkflowRun's job calls on the test cluster.
const kubeLib = `metadata: {name: kube-lib}
spec:
  inputs: [{name: version, required: true}]
  env: [{name: LIB, value: 'lib-${{ inputs.version }}'}]
  outputs: [{name: artifact, value: '${{ jobs.pack.outputs.name }}'}]
  jobs:
  - {id: compile, runsOn: bash, steps: [{run: 'echo "compiling ${{ inputs.version }}"'}]}
  - id: pack
    needs: [compile]
    runsOn: bash
    outputs: [{name: name, value: '${{ steps.p.outputs.name }}'}]
    steps: [{id: p, run: 'echo "name=pkg-$LIB-${{ needs.compile.result }}" >> "$GITHUB_OUTPUT"'}]
`

const kubeCallingRun = `metadata: {name: %s}
spec:
  jobs:
  - id: build
    runsOn: bash
    outputs: [{name: v, value: '${{ steps.v.outputs.v }}'}]
    steps: [{id: v, run: 'echo "v=1.2" >> "$GITHUB_OUTPUT"'}]
  - id: call
    needs: [build]
    uses: kube-lib
    with: [{name: version, value: '${{ needs.build.outputs.v }}'}]
  - id: after
    needs: [call]
    runsOn: bash
    steps: [{id: a, run: 'echo "got=${{ needs.call.outputs.artifact }}" >> "$GITHUB_OUTPUT"'}]
`

// testWorkflowCalls: a job that calls a Workflow (uses:) on the test
// cluster: the called jobs run under the calling job's name with its
// with: as their inputs, the called Workflow is in the run's snapshot, and
// its outputs reach the job that needs the call.
func testWorkflowCalls(t *testing.T, e *kubeEnv) {
	const name = "calls-lib"
	var lib v1alpha1.Workflow
	if err := yaml.UnmarshalStrict([]byte(kubeLib), &lib); err != nil {
		t.Fatal(err)
	}
	lib.APIVersion, lib.Kind, lib.Namespace = v1alpha1.GroupVersion.String(), v1alpha1.KindWorkflow, runsNamespace
	ctx := context.Background()
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("workflows").Body(&lib).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := e.stoke.Delete().Namespace(runsNamespace).Resource("workflows").Name(lib.Name).Do(context.Background()).Error()
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete workflow: %v", err)
		}
	})
	wfs := e.watchWorkflowRuns(t)
	runs := e.watchRuns(t, "stoke.dev/workflowrun="+name)
	e.mustCreateWorkflowRun(t, fmt.Sprintf(kubeCallingRun, name))
	t.Cleanup(func() { e.deleteWorkflowRuns(t, name) })
	wf := awaitWorkflowEnd(t, wfs, name)
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("%s:\n%s", wf.Status.Phase, workflowText(wf))
	}
	for _, j := range []string{"build", "call", "call/compile", "call/pack", "after"} {
		if got := jobPhase(wf, j); got != v1alpha1.JobSucceeded {
			t.Errorf("job %s: %s\n%s", j, got, workflowText(wf))
		}
	}
	if sn := wf.Status.Snapshot; sn == nil || len(sn.Called) != 1 || sn.Called[0].Name != "kube-lib" {
		t.Errorf("snapshot %+v", sn)
	}
	after := wf.Status.Jobs[len(wf.Status.Jobs)-1]
	m := runs.until(t, runBound, "the last step Run", func(m map[string]*v1alpha1.Run) bool {
		r := m[after.Steps[0].Run]
		return r != nil && terminal(r.Status.Phase)
	})
	if got := m[after.Steps[0].Run].Status.Outputs["got"]; got != "pkg-lib-1.2-success" {
		t.Errorf("after got %q from the call, want pkg-lib-1.2-success", got)
	}
}
