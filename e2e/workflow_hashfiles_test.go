package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
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
}
