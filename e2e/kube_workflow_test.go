package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact/s3test"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// The artifact store of the test cluster: versitygw (the S3-compatible
// server internal/artifact's tests use, internal/artifact/s3test) on a
// loopback address, which the node agent's Pods reach; the chart's
// credentialsSecret gives the controller and the gateway its key pair.
const (
	kubeS3Bucket    = "artifacts"
	kubeS3Secret    = "stoke-artifacts-s3"
	kubeS3AccessKey = "E2EACCESSKEY"
	kubeS3SecretKey = "e2e-secret-key"
)

// startKubeS3 starts the server with the test's key pair, whose SigV4
// signature it checks on every request, and makes the bucket.
func startKubeS3(t testing.TB) string {
	t.Helper()
	srv := s3test.StartWith(t, s3test.Options{AccessKey: kubeS3AccessKey, SecretKey: kubeS3SecretKey})
	if err := srv.CreateBucket(context.Background(), kubeS3Bucket); err != nil {
		t.Fatal(err)
	}
	return srv.Endpoint
}

// kubeS3Values are the chart's artifacts values for the stand-in at url.
func kubeS3Values(url string) map[string]any {
	return map[string]any{"s3": map[string]any{"bucket": kubeS3Bucket, "endpoint": url, "region": "us-east-1",
		"pathStyle": true, "credentialsSecret": kubeS3Secret}}
}

// kubeS3SecretYAML is the Secret the chart's credentialsSecret names.
func kubeS3SecretYAML() string {
	return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\nstringData:\n  AWS_ACCESS_KEY_ID: %s\n  AWS_SECRET_ACCESS_KEY: %s\n",
		kubeS3Secret, stokeNamespace, kubeS3AccessKey, kubeS3SecretKey)
}

// kubePipeline is the pipeline as a WorkflowRun: build checks
// out the repository and uploads what it built; test, a matrix of 3,
// downloads it, checks it and sets an output; publish reads that output
// through needs. fail names the matrix instance that fails ("none").
const kubePipeline = `apiVersion: stoke.dev/v1alpha1
kind: WorkflowRun
metadata: {name: %s, namespace: %s}
spec:
  source: {url: %q, commit: %q}
  jobs:
  - id: build
    runsOn: bash
    steps:
    - uses: checkout
    - {id: make, run: 'mkdir -p dist && cp VERSION dist/ && echo built >> dist/VERSION'}
    - {uses: upload-artifact, with: [{name: name, value: dist}, {name: path, value: dist/}]}
  - id: test
    needs: [build]
    runsOn: bash
    strategy: {failFast: false, matrix: {axes: [{name: x, values: [a, b, c]}]}}
    outputs: [{name: passed, value: '${{ steps.t.outputs.passed }}'}]
    steps:
    - {uses: download-artifact, with: [{name: name, value: dist}, {name: path, value: got}]}
    - id: t
      run: 'grep -qx built got/VERSION && test "$X" != %q && echo "passed=$(head -n1 got/VERSION)" >> "$GITHUB_OUTPUT"'
      env: [{name: X, value: '${{ matrix.x }}'}]
  - id: publish
    needs: [test]
    runsOn: bash
    steps:
    - run: 'test "${{ needs.test.outputs.passed }}" = 1.2'
`

// The 3-job pipeline on the cluster: checkout of a repository
// (git over HTTP on loopback), an artifact from build to test through
// the controller's S3 store, an output from test to publish; Succeeded,
// every job too, and the artifact is in the bucket the gateway serves.
// The same pipeline with test (b) failing ends Failed with publish
// Skipped.
func testWorkflowPipeline(t *testing.T, e *kubeEnv) {
	git := gittest.NewServer(t, gittest.Options{})
	commit, url := git.Commit(t, "app", map[string]string{"VERSION": "1.2\n"})
	wfs := follow(t, cache.NewListWatchFromClient(e.stoke, "workflowruns", runsNamespace, fields.Everything()), &v1alpha1.WorkflowRun{})
	dir := t.TempDir()
	run := func(name, fail string) *v1alpha1.WorkflowRun {
		f := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(f, fmt.Appendf(nil, kubePipeline, name, runsNamespace, url, commit, fail), 0o600); err != nil {
			t.Fatal(err)
		}
		e.applyFile(t, f)
		return wfs.until(t, 3*runBound, name+" ends", func(m map[string]*v1alpha1.WorkflowRun) bool {
			wf := m[name]
			return wf != nil && wf.Status.Phase.Terminal()
		})[name]
	}
	wf := run("pipeline", "none")
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("pipeline: %s %s: %+v", wf.Status.Phase, wf.Status.Message, wf.Status.Jobs)
	}
	for _, j := range []string{"build", "test (a)", "test (b)", "test (c)", "publish"} {
		if p := jobPhase(wf, j); p != v1alpha1.JobSucceeded {
			t.Errorf("job %s: %s", j, p)
		}
	}
	// stoke artifacts, through the gateway as the aggregated API: the
	// artifact build uploaded, from the controller's bucket.
	out := e.cluster.Kubectl(t, "get", "--raw", "/apis/gateway.stoke.dev/v1alpha1/namespaces/"+runsNamespace+"/workflowruns/pipeline/artifacts")
	if !strings.Contains(out, `"name":"dist"`) {
		t.Errorf("the gateway lists the artifacts %s, want dist", out)
	}

	wf = run("pipeline-fails", "b")
	if wf.Status.Phase != v1alpha1.WorkflowFailed || jobPhase(wf, "test (b)") != v1alpha1.JobFailed ||
		jobPhase(wf, "test (a)") != v1alpha1.JobSucceeded || jobPhase(wf, "publish") != v1alpha1.JobSkipped {
		t.Errorf("pipeline-fails: %s %s: %+v", wf.Status.Phase, wf.Status.Message, wf.Status.Jobs)
	}
}
