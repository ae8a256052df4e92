package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// ciWorkflow is the pipeline as a GitHub Actions file: build →
// test (a matrix of 3) → publish, and report, which runs always. build's
// steps share a workspace (the second reads what the first wrote) and
// pass env on through $GITHUB_ENV; build's output reaches test through
// needs, test's reaches publish. The env FAIL_SHARD (the %s) fails
// that test instance.
const ciWorkflow = `name: ci
on: [push]
env:
  STAGE: ci
  FAIL_SHARD: %s
jobs:
  build:
    runs-on: ubuntu-latest
    outputs:
      version: ${{ steps.v.outputs.version }}
    steps:
      - name: compile
        run: |
          echo "compiled in $STAGE" > out.txt
          echo "BUILT_BY=step1" >> "$GITHUB_ENV"
          echo "building"
      - id: v
        run: |
          test "$(cat out.txt)" = "compiled in ci"
          test "$BUILT_BY" = step1
          echo "version=1.$((1 + 1))" >> "$GITHUB_OUTPUT"
  test:
    needs: build
    runs-on: ubuntu-latest
    strategy:
      matrix:
        shard: [a, b, c]
    outputs:
      passed: ${{ steps.t.outputs.passed }}
    steps:
      - id: t
        run: |
          echo "testing ${{ matrix.shard }} of ${{ needs.build.outputs.version }}"
          if [ "${{ matrix.shard }}" = "$FAIL_SHARD" ]; then echo "shard failed" >&2; exit 1; fi
          echo "passed=${{ needs.build.outputs.version }}" >> "$GITHUB_OUTPUT"
  publish:
    needs: test
    runs-on: ubuntu-latest
    steps:
      - run: echo "publishing ${{ needs.test.outputs.passed }}"
  report:
    needs: [publish]
    if: always()
    runs-on: ubuntu-latest
    steps:
      - run: echo "report ${{ needs.publish.result }}"
`

// TestWorkflowsStandalone runs the workflow cases on stoke up.
func TestWorkflowsStandalone(t *testing.T) {
	runWorkflowCases(t, startCLIServer(t))
}

func runWorkflowCases(t *testing.T, s *cliServer) {
	dir := t.TempDir()
	file := func(name, fail string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, fmt.Appendf(nil, ciWorkflow, fail), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Run("PipelineSucceeds", func(t *testing.T) { workflowPipeline(t, s, file("ci.yml", "none")) })
	t.Run("PipelineFailsInTheRightJob", func(t *testing.T) { workflowPipelineFails(t, s, file("ci-fail.yml", "b")) })
	t.Run("Cancel", func(t *testing.T) { workflowCancel(t, s, dir) })
	t.Run("BadInput", func(t *testing.T) { workflowBadInput(t, s, dir) })
	t.Run("HashFiles", func(t *testing.T) { workflowHashFiles(t, s, dir) })
}

// getWorkflowRun reads a WorkflowRun through stoke up's HTTP API.
func (s *cliServer) getWorkflowRun(t *testing.T, name string) *v1alpha1.WorkflowRun {
	t.Helper()
	return (&stokeUp{Up: s.Up}).getWorkflowRun(t, name)
}

// createdName is the WorkflowRun's name from the note `stoke workflow
// run` writes first.
func createdName(t *testing.T, stderr string) string {
	t.Helper()
	for _, l := range strings.Split(stderr, "\n") {
		if rest, ok := strings.CutPrefix(l, "stoke: workflowrun "); ok {
			ref, _, _ := strings.Cut(rest, " ")
			_, name, _ := strings.Cut(ref, "/")
			return name
		}
	}
	t.Fatalf("no workflowrun created in:\n%s", stderr)
	return ""
}

func jobPhase(wf *v1alpha1.WorkflowRun, name string) v1alpha1.JobPhase {
	for _, j := range wf.Status.Jobs {
		if j.Name == name {
			return j.Phase
		}
	}
	return "none"
}

func workflowPipeline(t *testing.T, s *cliServer, file string) {
	r := stoke(t, s.env(), "", "workflow", "run", "-f", file, "--runs-on-default", "bash")
	if r.code != 0 {
		t.Fatalf("stoke workflow run: %s", r)
	}
	// Each step's output, prefixed with its job and step, as it ran.
	for _, want := range []string{
		"build/compile | building",
		"test (a)/t | testing a of 1.2",
		"test (c)/t | testing c of 1.2",
		"publish/Run echo \"publishing ${{ needs.test.outputs.passed }}\" | publishing 1.2",
		"report/Run echo \"report ${{ needs.publish.result }}\" | report success",
	} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("no line %q in the output:\n%s", want, r.stdout)
		}
	}
	wf := s.getWorkflowRun(t, createdName(t, r.stderr))
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("phase %s: %s", wf.Status.Phase, wf.Status.Message)
	}
	// build's two steps ran on one pod: the second was pinned to the first's.
	for _, j := range wf.Status.Jobs {
		if j.Phase != v1alpha1.JobSucceeded || j.PodUID == "" {
			t.Errorf("job %s: %s on %q", j.Name, j.Phase, j.PodUID)
		}
	}
}

func workflowPipelineFails(t *testing.T, s *cliServer, file string) {
	r := stoke(t, s.env(), "", "workflow", "run", "-f", file, "--runs-on-default", "bash")
	if r.code != 1 || !strings.Contains(r.stderr, "test (b)") {
		t.Fatalf("want exit 1 naming test (b): %s", r)
	}
	if !strings.Contains(r.stderr, "test (b)/t | shard failed\n") {
		t.Errorf("the failing step's stderr is not on stderr, prefixed:\n%s", r.stderr)
	}
	wf := s.getWorkflowRun(t, createdName(t, r.stderr))
	want := map[string]v1alpha1.JobPhase{"build": v1alpha1.JobSucceeded, "test (b)": v1alpha1.JobFailed,
		"publish": v1alpha1.JobSkipped, "report": v1alpha1.JobSucceeded}
	for name, ph := range want {
		if got := jobPhase(wf, name); got != ph {
			t.Errorf("job %s: %s, want %s", name, got, ph)
		}
	}
	if wf.Status.Phase != v1alpha1.WorkflowFailed {
		t.Errorf("phase %s", wf.Status.Phase)
	}
	if !strings.Contains(r.stdout, "report/Run echo \"report ${{ needs.publish.result }}\" | report skipped\n") {
		t.Errorf("report did not see publish skipped:\n%s", r.stdout)
	}
}

// slowWorkflow's first job runs a step that waits; second needs it.
const slowWorkflow = `name: slow
on: push
jobs:
  first:
    runs-on: any
    steps:
      - id: wait
        run: |
          echo started
          sleep 4242
      - run: echo never
  second:
    needs: first
    runs-on: any
    steps:
      - run: echo never
`

func workflowCancel(t *testing.T, s *cliServer, dir string) {
	file := filepath.Join(dir, "slow.yml")
	if err := os.WriteFile(file, []byte(slowWorkflow), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, lines, stderr := startStoke(t, s.env(), "workflow", "run", "-f", file, "--runs-on-default", "bash")
	awaitLine(t, lines, "the step's first line", func(l string) bool { return l == "first/wait | started" })
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd); code != 130 {
		t.Fatalf("exit %d after Ctrl-C; stderr:\n%s", code, stderr)
	}
	name := createdName(t, stderr.String())
	var wf *v1alpha1.WorkflowRun
	deadline := time.Now().Add(60 * time.Second)
	for {
		wf = s.getWorkflowRun(t, name)
		if wf.Status.Phase.Terminal() || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polls a CLI: no event to wait on
	}
	if wf.Status.Phase != v1alpha1.WorkflowCancelled {
		t.Fatalf("phase %s", wf.Status.Phase)
	}
	first := wf.Status.Jobs[0]
	if first.Phase != v1alpha1.JobCancelled || first.Steps[0].Phase != v1alpha1.JobCancelled || first.Steps[1].Phase != v1alpha1.JobSkipped {
		t.Errorf("first: %s, steps %s %s", first.Phase, first.Steps[0].Phase, first.Steps[1].Phase)
	}
	if got := jobPhase(wf, "second"); got != v1alpha1.JobSkipped {
		t.Errorf("second: %s", got)
	}
	if run := s.getRun(t, first.Steps[0].Run); run.Status.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("the step Run: %s", run.Status.Phase)
	}
	if s.standalone() {
		if left := awaitGone(5*time.Second, processesRunning("sleep", "4242")); len(left) > 0 {
			t.Errorf("left running after the cancel:\n%s", describeProcesses(left))
		}
	}
}

func workflowBadInput(t *testing.T, s *cliServer, dir string) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"cycle", "jobs:\n  a: {runs-on: x, needs: b, steps: [{run: 'true'}]}\n  b: {runs-on: x, needs: a, steps: [{run: 'true'}]}\n", "cycle"},
		{"unknown needs", "jobs:\n  a: {runs-on: x, needs: nope, steps: [{run: 'true'}]}\n", "nope"},
		{"unknown uses", "jobs:\n  a: {runs-on: x, steps: [{uses: actions/setup-go@v5}]}\n", "setup-go"},
		{"bad expression", "jobs:\n  a: {runs-on: x, if: '${{ 1 + }}', steps: [{run: 'true'}]}\n", "if"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yml")
			if err := os.WriteFile(f, []byte("on: push\n"+tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			s.fails(t, 1, tc.want, "workflow", "run", "-f", f, "--runs-on-default", "bash")
		})
	}
}
