package wfconvert

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// ci is a GitHub Actions file in the subset: the pipeline.
const ci = `name: CI
on:
  push:
    branches: [main]
permissions:
  contents: read
env:
  GOFLAGS: -mod=readonly
jobs:
  build:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    outputs:
      sha: ${{ steps.sha.outputs.sha }}
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depth: 0
      - id: sha
        name: Build
        run: |
          make
          echo "sha=$(git rev-parse HEAD)" >> "$GITHUB_OUTPUT"
      - uses: actions/upload-artifact@v4
        with: {name: bin, path: out/}
  test:
    needs: build
    runs-on: [self-hosted, linux]
    strategy:
      fail-fast: false
      max-parallel: 2
      matrix:
        shard: [1, 2, 3]
        os: [linux]
        include:
          - shard: 3
            slow: true
        exclude:
          - shard: 2
    steps:
      - uses: actions/download-artifact@v4
        with: {name: bin}
      - run: ./test.sh
        shell: bash
        env:
          SHARD: ${{ matrix.shard }}
        working-directory: out
        continue-on-error: true
        timeout-minutes: 5
  publish:
    needs: [build, test]
    if: github.run_attempt == '1'
    runs-on: ubuntu-latest
    steps:
      - run: echo "${SHA}"
        env: {SHA: '${{ needs.build.outputs.sha }}'}
  notify:
    needs: publish
    if: always()
    uses: notify
    with:
      channel: ci
`

// want is ci as a WorkflowRun spec.
const want = `apiVersion: stoke.dev/v1alpha1
kind: WorkflowRun
metadata: {}
spec:
  env:
  - name: GOFLAGS
    value: -mod=readonly
  jobs:
  - id: build
    outputs:
    - name: sha
      value: ${{ steps.sha.outputs.sha }}
    runsOn: bash
    steps:
    - uses: checkout
      with:
      - name: fetch-depth
        value: "0"
    - id: sha
      name: Build
      run: |
        make
        echo "sha=$(git rev-parse HEAD)" >> "$GITHUB_OUTPUT"
    - uses: upload-artifact
      with:
      - name: name
        value: bin
      - name: path
        value: out/
    timeoutMinutes: 10
  - id: test
    needs:
    - build
    runsOn: big
    steps:
    - uses: download-artifact
      with:
      - name: name
        value: bin
    - continueOnError: true
      env:
      - name: SHARD
        value: ${{ matrix.shard }}
      run: ./test.sh
      shell: bash
      timeoutMinutes: 5
      workingDirectory: out
    strategy:
      failFast: false
      matrix:
        axes:
        - name: shard
          values:
          - 1
          - 2
          - 3
        - name: os
          values:
          - linux
        exclude:
        - shard: 2
        include:
        - shard: 3
          slow: true
      maxParallel: 2
  - id: publish
    if: github.run_attempt == '1'
    needs:
    - build
    - test
    runsOn: bash
    steps:
    - env:
      - name: SHA
        value: ${{ needs.build.outputs.sha }}
      run: echo "${SHA}"
  - id: notify
    if: always()
    needs:
    - publish
    uses: notify
    with:
    - name: channel
      value: ci
status: {}
`

func TestConvert(t *testing.T) {
	w, err := Convert([]byte(ci), Options{RunsOn: map[string]string{"ubuntu-latest": "bash", "self-hosted": "big"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := yaml.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	// What it makes is a valid WorkflowRun (the called Workflow aside).
	w.Name = "ci"
	validation.SetWorkflowRunDefaults(w)
	if err := validation.ValidateWorkflowRun(t.Context(), w, nil); err != nil {
		t.Fatal(err)
	}
}

func TestConvertRunsOn(t *testing.T) {
	for _, tt := range []struct {
		runsOn, want string
		o            Options
	}{
		{"ubuntu-latest", "bash", Options{RunsOn: map[string]string{"ubuntu-latest": "bash"}}},
		{"ubuntu-latest", "pool", Options{DefaultRuntime: "pool"}},
		{"python", "python", Options{}},
		{"${{ matrix.runtime }}", "${{ matrix.runtime }}", Options{DefaultRuntime: "pool"}},
	} {
		w, err := Convert([]byte("jobs:\n  a:\n    runs-on: "+tt.runsOn+"\n    steps: [{run: 'true'}]\n"), tt.o)
		if err != nil {
			t.Fatalf("%s: %v", tt.runsOn, err)
		}
		if got := w.Spec.Jobs[0].RunsOn; got != tt.want {
			t.Errorf("runs-on %s: %s, want %s", tt.runsOn, got, tt.want)
		}
	}
}

// What is not in the subset is refused, naming the key and its line.
func TestConvertRefuses(t *testing.T) {
	for _, tt := range []struct {
		name, file, want string
	}{
		{"other action", "jobs:\n  a:\n    runs-on: bash\n    steps:\n      - uses: actions/setup-go@v5\n", `jobs.a.steps[0].uses: "actions/setup-go@v5" is not an action Stoke runs (it runs checkout, upload-artifact, download-artifact, and their actions/ names) (line 5)`},
		{"docker action", "jobs:\n  a:\n    runs-on: bash\n    steps:\n      - uses: docker://alpine\n", `"docker://alpine" is not an action Stoke runs`},
		{"services", "jobs:\n  a:\n    runs-on: bash\n    services:\n      db: {image: postgres}\n    steps: [{run: 'true'}]\n", "jobs.a.services: is not supported by Stoke's workflows (docs/workflows.md lists the keys it runs) (line 4)"},
		{"container", "jobs:\n  a:\n    runs-on: bash\n    container: node:20\n    steps: [{run: 'true'}]\n", "jobs.a.container: is not supported"},
		{"concurrency", "concurrency: ci\njobs:\n  a:\n    runs-on: bash\n    steps: [{run: 'true'}]\n", "concurrency: is not supported by Stoke's workflows (docs/workflows.md lists the keys it runs) (line 1)"},
		{"defaults", "defaults:\n  run: {shell: sh}\njobs: {}\n", "defaults: is not supported"},
		{"matrix expression", "jobs:\n  a:\n    runs-on: bash\n    strategy:\n      matrix: ${{ fromJSON(needs.x.outputs.m) }}\n    steps: [{run: 'true'}]\n", "jobs.a.strategy.matrix: a matrix made by an expression is not supported"},
		{"unknown runs-on", "jobs:\n  a:\n    runs-on: Ubuntu Latest\n    steps: [{run: 'true'}]\n", `jobs.a.runs-on: "Ubuntu Latest" is no Runtime: map it (--runs-on Ubuntu Latest=RUNTIME) or give a default Runtime (line 3)`},
		{"reusable workflow file", "jobs:\n  a:\n    uses: ./.github/workflows/lib.yml\n", `jobs.a.uses: "./.github/workflows/lib.yml": a job's uses names a Workflow`},
		{"step key", "jobs:\n  a:\n    runs-on: bash\n    steps:\n      - run: 'true'\n        retries: 3\n", "jobs.a.steps[0].retries: is not supported"},
		{"timeout expression", "jobs:\n  a:\n    runs-on: bash\n    timeout-minutes: ${{ inputs.t }}\n    steps: [{run: 'true'}]\n", `jobs.a.timeout-minutes: "${{ inputs.t }}" must be a whole number`},
		{"no jobs", "on: push\n", "jobs: is missing"},
		{"not a mapping", "- 1\n", "must be a mapping"},
		{"not YAML", "jobs: [\n", "not valid YAML"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Convert([]byte(tt.file), Options{})
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want InvalidArgument with %q", err, tt.want)
			}
		})
	}
}
