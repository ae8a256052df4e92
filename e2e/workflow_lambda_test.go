package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact/s3test"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// lambdaWorkflow: build, on a lambda Runtime, checks out a repository;
// its make step writes dist/app.txt (and dist/tmp/scratch.o) in its
// Lambda sandbox, which is written back into the job's workspace; its
// clean step removes dist/tmp and the checkout's VERSION, and the next
// step (another invocation) does not see them, reads and changes
// dist/app.txt and outputs its SHA-256; upload-artifact
// sends it from a third sandbox (the copy goes through the sandbox's exec
// agent). use, on a local bash Runtime, downloads it and checks it
// against that SHA-256 in its next step.
const lambdaWorkflow = `apiVersion: stoke.dev/v1alpha1
kind: WorkflowRun
metadata: {name: on-lambda, namespace: default}
spec:
  source: {url: %q, commit: %q}
  jobs:
  - id: build
    runsOn: lambda-bash
    outputs: [{name: sum, value: '${{ steps.change.outputs.sum }}'}]
    steps:
    - uses: checkout
    - {id: make, run: 'mkdir -p dist/tmp && cat VERSION > dist/app.txt && head -c 300000 /dev/urandom | base64 >> dist/app.txt && echo scratch > dist/tmp/scratch.o'}
    - {id: clean, run: 'rm -rf dist/tmp && rm VERSION'}
    - id: change
      run: |
        set -e
        test ! -e dist/tmp
        test ! -e VERSION
        grep -qx 1.2 dist/app.txt
        echo "changed by the second step" >> dist/app.txt
        echo "sum=$(sha256sum dist/app.txt | cut -c1-64)" >> "$STOKE_OUTPUTS"
    - {uses: upload-artifact, with: [{name: name, value: dist}, {name: path, value: dist/app.txt}, {name: if-no-files-found, value: error}]}
  - id: use
    needs: [build]
    runsOn: bash
    steps:
    - {uses: download-artifact, with: [{name: name, value: dist}, {name: path, value: got}]}
    - {id: read, run: 'echo "${{ needs.build.outputs.sum }}  got/app.txt" | sha256sum -c - && tail -n 1 got/app.txt && echo "read $(head -n 1 got/app.txt)"'}
`

// TestWorkflowOnLambda runs a 2-job workflow whose first job runs on a
// lambda Runtime (the simulator with the real RIE), on a stoke up that
// keeps artifacts in S3 (versitygw, --artifact-s3-*): a file one of
// build's steps writes on Lambda reaches its next step and its upload
// (each step's sandbox is written back into the job's workspace); the
// artifact leaves its Lambda sandbox through the exec agent, lies in the
// bucket and reaches use, whose SHA-256 check fails on any other bytes.
func TestWorkflowOnLambda(t *testing.T) {
	startLambda(t, 20)
	// One AWS key pair for both services, from stoke up's environment,
	// as an account's would be.
	srv := s3test.StartWith(t, s3test.Options{AccessKey: lambdaAccessKey, SecretKey: "secret"})
	if err := srv.CreateBucket(t.Context(), "artifacts"); err != nil {
		t.Fatal(err)
	}
	u := startUp(t, t.TempDir(), "--artifact-s3-bucket", "artifacts", "--artifact-s3-endpoint", srv.Endpoint,
		"--artifact-s3-region", s3test.Region, "--artifact-s3-path-style")
	launcher := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(launcher, []byte("#!/usr/bin/env bash\nexec -a bootstrap "+stokeBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u.applyLambdaRuntime(t, "lambda-bash", "bash", launcher)
	s := &cliServer{Up: u.Up, dataplane: true}
	git := gittest.NewServer(t, gittest.Options{})
	commit, url := git.Commit(t, "app", map[string]string{"VERSION": "1.2\n"})
	file := filepath.Join(t.TempDir(), "lambda.yaml")
	if err := os.WriteFile(file, fmt.Appendf(nil, lambdaWorkflow, url, commit), 0o644); err != nil {
		t.Fatal(err)
	}
	r := stoke(t, s.env(), "", "workflow", "run", "-f", file)
	wf := s.getWorkflowRun(t, createdName(t, r.stderr))
	if r.code != 0 || wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("stoke workflow run: %s\nphase %s: %s", r, wf.Status.Phase, wf.Status.Message)
	}
	for _, want := range []string{"use/read | got/app.txt: OK\n", "use/read | changed by the second step\n", "use/read | read 1.2\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("use did not read what build's steps wrote and changed on Lambda (no %q):\n%s", want, r.stdout)
		}
	}
	out, err := srv.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String("artifacts"),
		Prefix: aws.String("stoke-artifacts/default/" + string(wf.UID) + "/manifests/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Contents) != 1 || !strings.HasSuffix(aws.ToString(out.Contents[0].Key), "/dist.json") {
		t.Fatalf("manifests in the bucket: %+v", out.Contents)
	}
}
