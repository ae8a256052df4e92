package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// hashWorkflow's first step writes files; the next steps call
// hashFiles() in their run, env and if: each is answered by a hash Run
// on the job's pod, in its workspace. The last one names a link that
// leads out of the workspace, which is refused.
const hashWorkflow = `name: hash
on: push
jobs:
  build:
    runs-on: any
    steps:
      - run: |
          mkdir -p a/b a-c
          printf one > go.sum; printf two > a/go.sum; printf three > a/b/go.sum; printf four > a-c/go.sum
          printf x > notes.txt
          ln -s /etc/hostname out
      - id: key
        if: hashFiles('nothing/**') == ''
        env:
          MOD: go-${{ hashFiles('go.sum') }}
        run: |
          echo "all=${{ hashFiles('**/go.sum', '!a-c/**') }}"
          echo "mod=$MOD"
      - id: escape
        continue-on-error: true
        run: echo "${{ hashFiles('out') }}"
      - id: report
        run: |
          echo "### Hashes" >> "$GITHUB_STEP_SUMMARY"
          echo "all matched" >> "$GITHUB_STEP_SUMMARY"
          echo "saved=1" >> "$GITHUB_STATE"
`

// githubHash is hashFiles' digest written out: the SHA-256 of the files'
// SHA-256 digests, in the order GitHub's walk finds them.
func githubHash(contents ...string) string {
	all := sha256.New()
	for _, c := range contents {
		one := sha256.Sum256([]byte(c))
		all.Write(one[:])
	}
	return hex.EncodeToString(all.Sum(nil))
}

func workflowHashFiles(t *testing.T, s *cliServer, dir string) {
	file := filepath.Join(dir, "hash.yml")
	if err := os.WriteFile(file, []byte(hashWorkflow), 0o644); err != nil {
		t.Fatal(err)
	}
	r := stoke(t, s.env(), "", "workflow", "run", "-f", file, "--runs-on-default", "bash")
	if r.code != 0 {
		t.Fatalf("stoke workflow run: %s", r)
	}
	// GitHub's walk: a/b/go.sum, a/go.sum, go.sum (a-c excluded).
	for _, want := range []string{
		"build/key | all=" + githubHash("three", "two", "one"),
		"build/key | mod=go-" + githubHash("one"),
	} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("no line %q in the output:\n%s", want, r.stdout)
		}
	}
	wf := s.getWorkflowRun(t, createdName(t, r.stderr))
	steps := wf.Status.Jobs[0].Steps
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded || steps[1].Phase != v1alpha1.JobSucceeded {
		t.Fatalf("phase %s, steps %+v", wf.Status.Phase, steps)
	}
	if steps[2].Phase != v1alpha1.JobFailed || steps[2].Run != "" || !strings.Contains(steps[2].Message, "hashFiles") || !strings.Contains(steps[2].Message, "escapes") {
		t.Errorf("the escaping link's step: %+v", steps[2])
	}
	// $GITHUB_STEP_SUMMARY is shown under its step by describe;
	// $GITHUB_STATE was there to write to.
	d := stoke(t, s.env(), "", "describe", "workflowrun", wf.Name)
	if d.code != 0 || !regexp.MustCompile(`Summary:\s+### Hashes\n\s+all matched\n`).MatchString(d.stdout) {
		t.Errorf("describe shows no summary under the last step: %s", d)
	}
}

// kubeHashWorkflow: hashFiles on the test cluster, in a step's env and
// if; the step puts what it got in its outputs.
const kubeHashWorkflow = `metadata: {name: %s}
spec:
  jobs:
  - id: build
    runsOn: bash
    steps:
    - run: 'mkdir -p a/b a-c; printf one > go.sum; printf two > a/go.sum; printf three > a/b/go.sum; printf four > a-c/go.sum'
    - id: key
      if: hashFiles('nothing/**') == ''
      env: [{name: KEY, value: "${{ hashFiles('**/go.sum', '!a-c/**') }}"}]
      run: 'echo "key=$KEY" >> "$GITHUB_OUTPUT"'
`

// testWorkflowHashFiles: on the cluster, the hash Run runs `stoke
// hash-files` on the job's runtime Pod, in its workspace, and the step
// gets GitHub's digest.
func testWorkflowHashFiles(t *testing.T, e *kubeEnv) {
	const name = "hash-files"
	wfs := e.watchWorkflowRuns(t)
	runs := e.watchRuns(t, "stoke.dev/workflowrun="+name)
	e.mustCreateWorkflowRun(t, fmt.Sprintf(kubeHashWorkflow, name))
	t.Cleanup(func() { e.deleteWorkflowRuns(t, name) })
	wf := awaitWorkflowEnd(t, wfs, name)
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("%s:\n%s", wf.Status.Phase, workflowText(wf))
	}
	job := wf.Status.Jobs[0]
	m := runs.until(t, runBound, "the step Runs", func(m map[string]*v1alpha1.Run) bool {
		r := m[job.Steps[1].Run]
		return r != nil && terminal(r.Status.Phase)
	})
	if got, want := m[job.Steps[1].Run].Status.Outputs["key"], githubHash("three", "two", "one"); got != want {
		t.Errorf("the step's key = %q, want GitHub's %q", got, want)
	}
	var hash *v1alpha1.Run
	for _, r := range m {
		if r.Labels["stoke.dev/step"] == "1-hash" {
			hash = r
		}
	}
	if hash == nil || hash.Status.Phase != v1alpha1.PhaseSucceeded || hash.Status.AssignedPodUID != job.PodUID {
		t.Errorf("the hash Run: %+v", hash)
	}
}
