package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// callsWorkflows are a reusable Workflow, lib (typed inputs, its own env,
// two jobs and an output), and release, which builds and calls lib with
// its build's output and its own inputs, then uses lib's output; report
// runs always.
const callsWorkflows = `apiVersion: stoke.dev/v1alpha1
kind: Workflow
metadata: {name: lib}
spec:
  inputs:
  - {name: version, required: true}
  - {name: count, type: number, default: "1"}
  - {name: fail, type: boolean}
  env: [{name: LIB, value: 'lib-${{ inputs.version }}'}]
  outputs: [{name: artifact, value: '${{ jobs.pack.outputs.name }}'}]
  jobs:
  - id: compile
    runsOn: bash
    steps:
    - run: |
        echo "compiling ${{ inputs.version }} x${{ inputs.count }} in $LIB (stage '${STAGE-}')"
        if [ "${{ inputs.fail }}" = true ]; then echo "compile failed" >&2; exit 1; fi
        echo made > out.txt
  - id: pack
    needs: [compile]
    runsOn: bash
    outputs: [{name: name, value: '${{ steps.p.outputs.name }}'}]
    steps:
    - id: p
      run: echo "name=pkg-$LIB-${{ needs.compile.result }}" >> "$GITHUB_OUTPUT"
---
apiVersion: stoke.dev/v1alpha1
kind: Workflow
metadata: {name: release}
spec:
  inputs:
  - {name: version, required: true}
  - {name: count, default: "2"}
  - {name: fail, type: boolean, default: "false"}
  env: [{name: STAGE, value: release}]
  outputs: [{name: shipped, value: '${{ jobs.call.outputs.artifact }}'}]
  jobs:
  - id: build
    runsOn: bash
    outputs: [{name: v, value: '${{ steps.v.outputs.v }}'}]
    steps:
    - {id: v, run: 'echo "v=${{ inputs.version }}.0" >> "$GITHUB_OUTPUT"'}
  - id: call
    needs: [build]
    uses: lib
    with:
    - {name: version, value: '${{ needs.build.outputs.v }}'}
    - {name: count, value: '${{ inputs.count }}'}
    - {name: fail, value: '${{ inputs.fail }}'}
  - id: after
    needs: [call]
    runsOn: bash
    steps:
    - run: echo "shipping ${{ needs.call.outputs.artifact }}"
  - id: report
    needs: [call, after]
    if: always()
    runsOn: bash
    steps:
    - run: echo "report ${{ needs.call.result }}"
`

// TestWorkflowCallsStandalone runs a Workflow that calls another on stoke
// up, through the CLI: inputs in, outputs out, the called jobs shown
// under their calling job; a failing variant; and bad input.
func TestWorkflowCallsStandalone(t *testing.T) {
	s := startCLIServer(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	s.ok(t, "apply", "-f", write("workflows.yaml", callsWorkflows))

	t.Run("Succeeds", func(t *testing.T) {
		r := stoke(t, s.env(), "", "workflow", "run", "release", "--set", "version=7", "--set", "count=3")
		if r.code != 0 {
			t.Fatalf("stoke workflow run: %s", r)
		}
		for _, want := range []string{
			// with: evaluated in the caller (build's output), typed (count
			// a number), lib's own env; the caller's env (STAGE) not passed.
			"call/compile/Run echo \"compiling ${{ inputs.version }} x${{ inputs.count }} in $LIB (stage '${STAGE-}')\" | compiling 7.0 x3 in lib-7.0 (stage '')",
			"after/Run echo \"shipping ${{ needs.call.outputs.artifact }}\" | shipping pkg-lib-7.0-success",
			"report/Run echo \"report ${{ needs.call.result }}\" | report success",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("no %q in the output:\n%s", want, r.stdout)
			}
		}
		name := createdName(t, r.stderr)
		wf := s.getWorkflowRun(t, name)
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded || len(wf.Status.Outputs) != 1 || wf.Status.Outputs[0].Value != "pkg-lib-7.0-success" {
			t.Errorf("run %s, outputs %v", wf.Status.Phase, wf.Status.Outputs)
		}
		if sn := wf.Status.Snapshot; sn == nil || sn.Spec == nil || len(sn.Called) != 1 || sn.Called[0].Name != "lib" {
			t.Errorf("snapshot %+v", sn)
		}
		var jobs []string
		for _, j := range wf.Status.Jobs {
			jobs = append(jobs, j.Name+"="+string(j.Phase))
		}
		if got := strings.Join(jobs, " "); got != "build=Succeeded call=Succeeded call/compile=Succeeded call/pack=Succeeded after=Succeeded report=Succeeded" {
			t.Errorf("jobs %s", got)
		}
		out := s.ok(t, "describe", "workflowrun", name)
		squeezed := squeezeLines(out)
		for _, want := range []string{"  call: Succeeded, calls Workflow lib, needs build", "    Output artifact: pkg-lib-7.0-success", "    call/compile: Succeeded", "    call/pack: Succeeded, needs compile"} {
			if !strings.Contains(squeezed, want) {
				t.Errorf("describe: no %q in\n%s", want, out)
			}
		}
	})

	t.Run("FailsInTheCalledJob", func(t *testing.T) {
		r := stoke(t, s.env(), "", "workflow", "run", "release", "--set", "version=8", "--set", "fail=true")
		if r.code != 1 || !strings.Contains(r.stderr, "compile failed") {
			t.Fatalf("stoke workflow run: want exit 1, got %s", r)
		}
		if !strings.Contains(r.stdout, "report/Run echo \"report ${{ needs.call.result }}\" | report failure") {
			t.Errorf("report (always()) did not run:\n%s", r.stdout)
		}
		wf := s.getWorkflowRun(t, createdName(t, r.stderr))
		want := map[string]v1alpha1.JobPhase{"build": v1alpha1.JobSucceeded, "call": v1alpha1.JobFailed, "call/compile": v1alpha1.JobFailed,
			"call/pack": v1alpha1.JobSkipped, "after": v1alpha1.JobSkipped, "report": v1alpha1.JobSucceeded}
		for job, ph := range want {
			if got := jobPhase(wf, job); got != ph {
				t.Errorf("%s: %s, want %s", job, got, ph)
			}
		}
		if wf.Status.Phase != v1alpha1.WorkflowFailed || !strings.Contains(wf.Status.Message, "call") {
			t.Errorf("run %s %q", wf.Status.Phase, wf.Status.Message)
		}
	})

	// An input whose value comes from an expression is typed when the
	// calling job starts: the call fails naming it, and no called job runs.
	t.Run("WrongInputTypeAtRun", func(t *testing.T) {
		r := stoke(t, s.env(), "", "workflow", "run", "release", "--set", "version=9", "--set", "count=many")
		if r.code != 1 {
			t.Fatalf("stoke workflow run: want exit 1, got %s", r)
		}
		wf := s.getWorkflowRun(t, createdName(t, r.stderr))
		for _, j := range wf.Status.Jobs {
			if j.Name == "call" && (j.Phase != v1alpha1.JobFailed || !strings.Contains(j.Message, `input "count" of Workflow "lib": "many" is not a number`)) {
				t.Errorf("call: %s %q", j.Phase, j.Message)
			}
		}
		if jobPhase(wf, "call/compile") != v1alpha1.JobSkipped || strings.Contains(r.stdout, "compiling") {
			t.Errorf("a called job ran: %s\n%s", jobPhase(wf, "call/compile"), r.stdout)
		}
	})

	// $GITHUB_PATH: a directory one step adds is on the next steps' PATH.
	t.Run("GitHubPath", func(t *testing.T) {
		f := write("path.yml", "on: push\njobs:\n  a:\n    runs-on: bash\n    steps:\n"+
			"      - run: |\n          mkdir -p tools && printf '#!/bin/sh\\necho tool ran\\n' > tools/mytool && chmod +x tools/mytool\n"+
			"          echo \"$PWD/tools\" >> \"$GITHUB_PATH\"\n"+
			"      - {id: use, run: mytool}\n")
		r := stoke(t, s.env(), "", "workflow", "run", "-f", f)
		if r.code != 0 || !strings.Contains(r.stdout, "a/use | tool ran") {
			t.Fatalf("stoke workflow run: %s", r)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, tc := range []struct{ name, file, want string }{
			{"unknown Workflow", "on: push\njobs:\n  call:\n    uses: nope\n", `no Workflow "nope"`},
			{"missing required input", "on: push\njobs:\n  call:\n    uses: lib\n    with: {count: 2}\n", `Workflow "lib" needs input "version"`},
			{"wrong input type", "on: push\njobs:\n  call:\n    uses: lib\n    with: {version: '1', count: many}\n", `"many" is not a number`},
			{"unknown input", "on: push\njobs:\n  call:\n    uses: lib\n    with: {version: '1', colour: red}\n", `Workflow "lib" has no input "colour"`},
			{"matrix of calls", "on: push\njobs:\n  call:\n    uses: lib\n    strategy: {matrix: {v: ['1', '2']}}\n    with: {version: '${{ matrix.v }}'}\n", "cannot have a strategy or matrix"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := write(strings.ReplaceAll(tc.name, " ", "-")+".yml", tc.file)
				s.fails(t, 1, tc.want, "workflow", "run", "-f", f, "--runs-on-default", "bash")
			})
		}
		s.fails(t, 1, `Workflow "release" needs input "version"`, "workflow", "run", "release")
		s.fails(t, 1, `"zz" is not a boolean`, "workflow", "run", "release", "--set", "version=1", "--set", "fail=zz")
		// A call cycle cannot be stored: the Workflow that would close it
		// is refused.
		s.fails(t, 1, "Workflow calls form a cycle: loop → loop", "apply", "-f", write("loop.yaml",
			"apiVersion: stoke.dev/v1alpha1\nkind: Workflow\nmetadata: {name: loop}\nspec:\n  jobs:\n  - {id: again, uses: loop}\n"))
		// Nothing was made by any of them but the runs above.
		list := s.ok(t, "get", "workflowruns")
		if n := strings.Count(list, "\n") - 1; n != 4 {
			t.Errorf("%d WorkflowRuns, want the 4 above:\n%s", n, list)
		}
	})
}

// squeezeLines keeps each line's indent and squeezes the spaces after it.
func squeezeLines(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		indent := len(l) - len(strings.TrimLeft(l, " "))
		lines = append(lines, strings.Repeat(" ", indent)+strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}
