package validation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// validWorkflowRun is the pipeline: build → test (a matrix of 3)
// → publish, and an always() job.
func validWorkflowRun() *v1alpha1.WorkflowRun {
	w := &v1alpha1.WorkflowRun{}
	w.Name, w.Namespace = "ci", "default"
	w.Spec = v1alpha1.WorkflowRunSpec{
		Source: &v1alpha1.GitSource{URL: "http://127.0.0.1:9418/repo.git", Ref: "main"},
		Env:    []v1alpha1.EnvVar{{Name: "MODE", Value: "ci"}},
		Jobs: []v1alpha1.Job{
			{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{
				{Uses: v1alpha1.UsesCheckout},
				{ID: "make", Run: "make && echo sha=$(git rev-parse HEAD) >> \"$GITHUB_OUTPUT\""},
				{Uses: v1alpha1.UsesUploadArtifact, With: []v1alpha1.NameValue{{Name: "name", Value: "bin"}, {Name: "path", Value: "out/"}}},
			}, Outputs: []v1alpha1.NameValue{{Name: "sha", Value: "${{ steps.make.outputs.sha }}"}}},
			{ID: "test", Needs: []string{"build"}, RunsOn: "bash", Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{
				Axes: []v1alpha1.MatrixAxis{{Name: "shard", Values: []apiextensionsv1.JSON{{Raw: []byte("1")}, {Raw: []byte("2")}, {Raw: []byte("3")}}}},
			}}, Steps: []v1alpha1.Step{
				{Uses: v1alpha1.UsesDownloadArtifact, With: []v1alpha1.NameValue{{Name: "name", Value: "bin"}}},
				{ID: "t", Name: "test ${{ matrix.shard }}", Run: "./test.sh", Env: []v1alpha1.EnvVar{{Name: "SHARD", Value: "${{ matrix.shard }}"}}, Shell: "bash"},
			}, Outputs: []v1alpha1.NameValue{{Name: "report", Value: "${{ steps.t.outputs.report }}"}}},
			{ID: "publish", Needs: []string{"test"}, RunsOn: "bash", Steps: []v1alpha1.Step{
				{Run: "echo $SHA", Env: []v1alpha1.EnvVar{{Name: "SHA", Value: "${{ needs.build.outputs.sha }}"}}, WorkingDirectory: "out"},
			}},
			{ID: "notify", Needs: []string{"publish"}, If: "always()", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "echo done", Shell: "sh"}}},
		},
	}
	SetWorkflowRunDefaults(w)
	return w
}

// validLib is a Workflow a job may call.
func validLib(name string, calls ...string) *v1alpha1.Workflow {
	w := &v1alpha1.Workflow{}
	w.Name, w.Namespace = name, "default"
	w.Spec = v1alpha1.WorkflowSpec{
		Inputs:  []v1alpha1.WorkflowInput{{Name: "n", Type: "number", Required: true}, {Name: "flag", Type: "boolean", Default: "false"}},
		Outputs: []v1alpha1.NameValue{{Name: "out", Value: "${{ jobs.one.outputs.v }}"}},
		Jobs:    []v1alpha1.Job{{ID: "one", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "echo ${{ inputs.n }}"}}}},
	}
	for i, c := range calls {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: fmt.Sprintf("call%d", i), Uses: c, With: []v1alpha1.NameValue{{Name: "n", Value: "1"}}})
	}
	SetWorkflowDefaults(w)
	return w
}

// workflows is a WorkflowGetter over a map.
func workflows(wfs ...*v1alpha1.Workflow) WorkflowGetter {
	m := map[string]*v1alpha1.Workflow{}
	for _, w := range wfs {
		m[w.Name] = w
	}
	return func(_ context.Context, ns, name string) (*v1alpha1.Workflow, error) {
		if w, ok := m[name]; ok && ns == w.Namespace {
			return w, nil
		}
		return nil, fmt.Errorf("workflow %s/%s: %w", ns, name, errdefs.ErrNotFound)
	}
}

func job(w *v1alpha1.WorkflowRun, id string) *v1alpha1.Job {
	for i := range w.Spec.Jobs {
		if w.Spec.Jobs[i].ID == id {
			return &w.Spec.Jobs[i]
		}
	}
	panic(id)
}

func axis(name string, n int) v1alpha1.MatrixAxis {
	a := v1alpha1.MatrixAxis{Name: name}
	for i := range n {
		a.Values = append(a.Values, apiextensionsv1.JSON{Raw: []byte(fmt.Sprint(i))})
	}
	return a
}

// workflowRunCase is one WorkflowRun and the answer: "" valid, else the
// field path the error names and a part of its message. crd marks the
// cases the CRD refuses too (CEL and OpenAPI can say them; TestCRD holds
// the API server to them); the rest need a parser, a graph or a lookup.
type workflowRunCase struct {
	name   string
	mutate func(*v1alpha1.WorkflowRun)
	field  string
	msg    string
	crd    bool
}

var workflowRunCases = []workflowRunCase{
	{"valid", func(*v1alpha1.WorkflowRun) {}, "", "", true},
	{"calls a Workflow", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Needs: []string{"build"}, Uses: "lib", With: []v1alpha1.NameValue{{Name: "n", Value: "${{ needs.build.outputs.sha }}"}}})
	}, "", "", false},
	{"runs a Workflow", func(w *v1alpha1.WorkflowRun) {
		w.Spec = v1alpha1.WorkflowRunSpec{Workflow: "lib", Inputs: []v1alpha1.NameValue{{Name: "n", Value: "3"}}}
	}, "", "", false},
	{"runsOn from the matrix", func(w *v1alpha1.WorkflowRun) { job(w, "test").RunsOn = "${{ matrix.runtime }}" }, "", "", true},
	{"hashFiles in a step's if, run, env and with", func(w *v1alpha1.WorkflowRun) {
		b := job(w, "build")
		b.Steps[1].If = "hashFiles('go.sum') != ''"
		b.Steps[1].Run = "echo ${{ hashFiles('**/go.sum', '!vendor/**') }}"
		b.Steps[1].Env = []v1alpha1.EnvVar{{Name: "H", Value: "${{ hashFiles('x') }}"}}
		b.Steps[2].With[0].Value = "bin-${{ hashFiles('out/**') }}"
	}, "", "", true},
	{"hashFiles in a job's if", func(w *v1alpha1.WorkflowRun) { job(w, "test").If = "hashFiles('x') != ''" }, "spec.jobs[1].if", "calls hashFiles, which is only available in a step's if, run, env and with", false},
	{"hashFiles in a job's env", func(w *v1alpha1.WorkflowRun) {
		job(w, "test").Env = []v1alpha1.EnvVar{{Name: "H", Value: "${{ hashFiles('x') }}"}}
	}, "spec.jobs[1].env[0].value", "calls hashFiles", false},
	{"hashFiles in the workflow's env", func(w *v1alpha1.WorkflowRun) { w.Spec.Env[0].Value = "${{ hashFiles('x') }}" }, "spec.env[0].value", "calls hashFiles", false},
	{"hashFiles in a job's outputs", func(w *v1alpha1.WorkflowRun) { job(w, "build").Outputs[0].Value = "${{ hashFiles('x') }}" }, "spec.jobs[0].outputs[0].value", "calls hashFiles", false},
	{"hashFiles in a step's name", func(w *v1alpha1.WorkflowRun) { job(w, "build").Steps[1].Name = "${{ hashFiles('x') }}" }, "spec.jobs[0].steps[1].name", "calls hashFiles", false},

	// The bad input.
	{"cycle", func(w *v1alpha1.WorkflowRun) { job(w, "build").Needs = []string{"publish"} }, "spec.jobs", "needs form a cycle: build → publish → test → build", false},
	{"needs itself", func(w *v1alpha1.WorkflowRun) { job(w, "build").Needs = []string{"build"} }, "spec.jobs[0].needs[0]", `job "build" needs itself`, false},
	{"unknown needs", func(w *v1alpha1.WorkflowRun) { job(w, "publish").Needs = []string{"tset"} }, "spec.jobs[2].needs[0]", `no job "tset" in this workflow`, false},
	{"unknown step uses", func(w *v1alpha1.WorkflowRun) { job(w, "build").Steps[0].Uses = "actions/setup-go@v5" }, "spec.jobs[0].steps[0].uses", `"actions/setup-go@v5" is not a step Stoke knows: uses must be one of checkout, upload-artifact, download-artifact`, true},
	{"unknown Workflow", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "x", Uses: "nope"})
	}, "spec.jobs[4].uses", `no Workflow "nope" in namespace "default"`, false},
	{"if does not parse", func(w *v1alpha1.WorkflowRun) { job(w, "publish").If = "needs.test.result ==" }, "spec.jobs[2].if", "does not parse", false},
	{"env expression does not parse", func(w *v1alpha1.WorkflowRun) { job(w, "publish").Steps[0].Env[0].Value = "${{ needs.build.outputs.sha" }, "spec.jobs[2].steps[0].env[0].value", "an expression does not parse", false},
	{"unknown context", func(w *v1alpha1.WorkflowRun) { job(w, "build").Outputs[0].Value = "${{ secrets.token }}" }, "spec.jobs[0].outputs[0].value", `unknown context "secrets"`, false},
	{"unknown function", func(w *v1alpha1.WorkflowRun) { job(w, "test").If = "${{ startsWith2('a', 'b') }}" }, "spec.jobs[1].if", `unknown function "startsWith2"`, false},
	{"run expression does not parse", func(w *v1alpha1.WorkflowRun) { job(w, "build").Steps[1].Run = "echo ${{ 1 2 }}" }, "spec.jobs[0].steps[1].run", "an expression does not parse", false},
	{"expression over 4 KiB", func(w *v1alpha1.WorkflowRun) { job(w, "publish").If = "'" + strings.Repeat("a", 4100) + "'" }, "spec.jobs[2].if", "is over 4096 bytes", true},
	{"matrix over the bound", func(w *v1alpha1.WorkflowRun) {
		job(w, "test").Strategy.Matrix.Axes = []v1alpha1.MatrixAxis{axis("a", 16), axis("b", 17)}
	}, "spec.jobs[1].strategy.matrix", "over the bound of 256 combinations", false},
	{"matrix all excluded", func(w *v1alpha1.WorkflowRun) {
		job(w, "test").Strategy.Matrix.Exclude = []apiextensionsv1.JSON{{Raw: []byte(`{"shard":1}`)}, {Raw: []byte(`{"shard":2}`)}, {Raw: []byte(`{"shard":3}`)}}
	}, "spec.jobs[1].strategy.matrix", "every combination of the matrix is excluded", false},
	{"matrix include not an object", func(w *v1alpha1.WorkflowRun) {
		job(w, "test").Strategy.Matrix.Include = []apiextensionsv1.JSON{{Raw: []byte(`"x"`)}}
	}, "spec.jobs[1].strategy.matrix", "include[0]: must be an object", false},
	{"duplicate axis", func(w *v1alpha1.WorkflowRun) {
		m := job(w, "test").Strategy.Matrix
		m.Axes = append(m.Axes, m.Axes[0])
	}, "spec.jobs[1].strategy.matrix.axes[1].name", "duplicates", true},
	{"too many job instances", func(w *v1alpha1.WorkflowRun) {
		job(w, "test").Strategy.Matrix.Axes = []v1alpha1.MatrixAxis{axis("a", 16), axis("b", 16)}
	}, "spec.jobs", "make 259 job instances", false},
	{"too many steps in all", func(w *v1alpha1.WorkflowRun) {
		j := job(w, "test")
		j.Strategy.Matrix.Axes = []v1alpha1.MatrixAxis{axis("a", 100)}
		for range 4 {
			j.Steps = append(j.Steps, v1alpha1.Step{Run: "true"})
		}
	}, "spec.jobs", "make 605 steps in all", false},
	{"duplicate job id", func(w *v1alpha1.WorkflowRun) { job(w, "notify").ID = "build" }, "spec.jobs[3].id", `"build" duplicates spec.jobs[0]`, true},
	{"bad job id", func(w *v1alpha1.WorkflowRun) { w.Spec.Jobs[3].ID = "9lives" }, "spec.jobs[3].id", "must match", true},
	{"duplicate step id", func(w *v1alpha1.WorkflowRun) { job(w, "test").Steps[0].ID = "t" }, "spec.jobs[1].steps[1].id", `"t" duplicates spec.jobs[1].steps[0]`, false},
	{"65 jobs", func(w *v1alpha1.WorkflowRun) {
		for i := range 61 {
			w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: fmt.Sprintf("j%d", i), RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "true"}}})
		}
	}, "spec.jobs", "has 65 jobs, at most 64 allowed", true},
	{"101 steps", func(w *v1alpha1.WorkflowRun) {
		j := job(w, "publish")
		for range 100 {
			j.Steps = append(j.Steps, v1alpha1.Step{Run: "true"})
		}
	}, "spec.jobs[2].steps", "has 101 steps, at most 100 allowed", true},

	// Shapes.
	{"neither workflow nor jobs", func(w *v1alpha1.WorkflowRun) { w.Spec.Jobs = nil }, "spec", "exactly one of workflow or jobs must be set, got neither", true},
	{"both workflow and jobs", func(w *v1alpha1.WorkflowRun) { w.Spec.Workflow = "lib" }, "spec", "exactly one of workflow or jobs must be set, got both", true},
	{"step with run and uses", func(w *v1alpha1.WorkflowRun) { job(w, "build").Steps[0].Run = "true" }, "spec.jobs[0].steps[0]", "exactly one of run or uses must be set, got both", true},
	{"step with neither", func(w *v1alpha1.WorkflowRun) { job(w, "build").Steps[0].Uses = "" }, "spec.jobs[0].steps[0]", "exactly one of run or uses must be set, got neither", true},
	{"job with steps and uses", func(w *v1alpha1.WorkflowRun) { job(w, "build").Uses = "lib" }, "spec.jobs[0]", "exactly one of steps or uses must be set, got both", true},
	{"job without runsOn", func(w *v1alpha1.WorkflowRun) { job(w, "build").RunsOn = "" }, "spec.jobs[0].runsOn", "must name a Runtime", true},
	{"runsOn not a label", func(w *v1alpha1.WorkflowRun) { job(w, "build").RunsOn = "Ubuntu_Latest" }, "spec.jobs[0].runsOn", "RFC 1123", true},
	{"bad shell", func(w *v1alpha1.WorkflowRun) { job(w, "notify").Steps[0].Shell = "pwsh" }, "spec.jobs[3].steps[0].shell", "must be one of bash, sh, python", true},
	{"working directory escapes", func(w *v1alpha1.WorkflowRun) { job(w, "publish").Steps[0].WorkingDirectory = "../etc" }, "spec.jobs[2].steps[0].workingDirectory", "must not contain '..'", false},
	{"working directory absolute", func(w *v1alpha1.WorkflowRun) { job(w, "publish").Steps[0].WorkingDirectory = "/etc" }, "spec.jobs[2].steps[0].workingDirectory", "must be relative", true},
	{"timeout over 360", func(w *v1alpha1.WorkflowRun) { job(w, "build").TimeoutMinutes = 361 }, "spec.jobs[0].timeoutMinutes", "must be 0–360", true},
	{"maxParallel negative", func(w *v1alpha1.WorkflowRun) { job(w, "test").Strategy.MaxParallel = -1 }, "spec.jobs[1].strategy.maxParallel", "must be 0–256", true},
	{"duplicate output", func(w *v1alpha1.WorkflowRun) {
		j := job(w, "build")
		j.Outputs = append(j.Outputs, j.Outputs[0])
	}, "spec.jobs[0].outputs[1].name", "duplicates", true},
	{"inputs with jobs", func(w *v1alpha1.WorkflowRun) { w.Spec.Inputs = []v1alpha1.NameValue{{Name: "n", Value: "1"}} }, "spec.inputs", "are a Workflow's", false},
	{"git source with both commit and ref", func(w *v1alpha1.WorkflowRun) { w.Spec.Source.Commit = strings.Repeat("a", 40) }, "spec.source", "exactly one of commit or ref must be set", true},
	{"name not a label", func(w *v1alpha1.WorkflowRun) { w.Name = "ci.nightly" }, "metadata.name", "must not contain dots", true},
	{"ttl negative", func(w *v1alpha1.WorkflowRun) { w.Spec.TTLSecondsAfterFinished = ptr(int32(-1)) }, "spec.ttlSecondsAfterFinished", "must not be negative", true},

	// Calls.
	{"call without a required input", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Uses: "lib"})
	}, "spec.jobs[4].with", `Workflow "lib" needs input "n"`, false},
	{"call with an unknown input", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Uses: "lib", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}, {Name: "m", Value: "1"}}})
	}, "spec.jobs[4].with[1].name", `Workflow "lib" has no input "m"`, false},
	{"call with a mistyped input", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Uses: "lib", With: []v1alpha1.NameValue{{Name: "n", Value: "one"}}})
	}, "spec.jobs[4].with[0].value", `"one" is not a number`, false},
	{"call with a matrix", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Uses: "lib", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}},
			Strategy: &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "a", Values: []apiextensionsv1.JSON{{Raw: []byte("1")}}}}}}})
	}, "spec.jobs[4].strategy", "a job that calls a Workflow (uses) cannot have a strategy or matrix", false},
	{"call with outputs of its own", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "lib", Uses: "lib", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}},
			Outputs: []v1alpha1.NameValue{{Name: "o", Value: "x"}}})
	}, "spec.jobs[4].outputs", "the job's outputs are the called Workflow's", false},
	{"calls over the job instance bound", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = nil
		for i := range 60 { // each lays out 8 jobs: itself, d2 → d3 → d4 → d5
			w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: fmt.Sprintf("c%d", i), Uses: "d2", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}}})
		}
	}, "spec.jobs", "with the Workflows they call, make 480 jobs and 480 job instances (matrix combinations counted), at most 256 allowed", false},
	{"call cycle", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "x", Uses: "loop-a", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}}})
	}, "spec.jobs[4].uses", "Workflow calls form a cycle: loop-a → loop-b → loop-a", false},
	{"call depth 5", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "x", Uses: "d1", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}}})
	}, "spec.jobs[4].uses", "Workflow calls nest 5 deep, at most 4 allowed: d1 → d2 → d3 → d4 → d5", false},
	{"call depth 4", func(w *v1alpha1.WorkflowRun) {
		w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "x", Uses: "d2", With: []v1alpha1.NameValue{{Name: "n", Value: "1"}}})
	}, "", "", false},
	{"runs an unknown Workflow", func(w *v1alpha1.WorkflowRun) { w.Spec = v1alpha1.WorkflowRunSpec{Workflow: "nope"} }, "spec.workflow", `no Workflow "nope"`, false},
	{"runs a Workflow without its input", func(w *v1alpha1.WorkflowRun) { w.Spec = v1alpha1.WorkflowRunSpec{Workflow: "lib"} }, "spec.inputs", `Workflow "lib" needs input "n"`, false},
	{"runs a Workflow that loops", func(w *v1alpha1.WorkflowRun) {
		w.Spec = v1alpha1.WorkflowRunSpec{Workflow: "loop-a", Inputs: []v1alpha1.NameValue{{Name: "n", Value: "1"}}}
	}, "spec.workflow", "Workflow calls form a cycle: loop-a → loop-b → loop-a", false},
}

// testWorkflows are the Workflows the cases call: lib, a loop of two,
// and a chain d1 → d2 → d3 → d4 → d5.
func testWorkflows() WorkflowGetter {
	return workflows(validLib("lib"), validLib("loop-a", "loop-b"), validLib("loop-b", "loop-a"),
		validLib("d1", "d2"), validLib("d2", "d3"), validLib("d3", "d4"), validLib("d4", "d5"), validLib("d5"))
}

func TestValidateWorkflowRun(t *testing.T) {
	for _, tt := range workflowRunCases {
		t.Run(tt.name, func(t *testing.T) {
			w := validWorkflowRun()
			tt.mutate(w)
			err := ValidateWorkflowRun(t.Context(), w, testWorkflows())
			wantErr(t, err, tt.field, tt.msg)
		})
	}
}

// wantErr checks a validation answer: nil for field "", else an
// InvalidArgument with a problem that names field and says msg.
func wantErr(t *testing.T, err error, field, msg string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("got %v, want InvalidArgument at %s", err, field)
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(line, field+": ") && strings.Contains(line, msg) {
			return
		}
	}
	t.Fatalf("got\n%v\nwant a problem at %s saying %q", err, field, msg)
}

func TestValidateWorkflow(t *testing.T) {
	get := testWorkflows()
	for _, tt := range []struct {
		name   string
		w      *v1alpha1.Workflow
		mutate func(*v1alpha1.Workflow)
		field  string
		msg    string
	}{
		{"valid", validLib("lib"), func(*v1alpha1.Workflow) {}, "", ""},
		{"calls another", validLib("top", "lib"), func(*v1alpha1.Workflow) {}, "", ""},
		{"calls itself", validLib("self", "self"), func(*v1alpha1.Workflow) {}, "spec.jobs[1].uses", "Workflow calls form a cycle: self → self"},
		{"closes a loop", validLib("d5", "d1"), func(*v1alpha1.Workflow) {}, "spec.jobs[1].uses", "d5 → d1 → d2 → d3 → d4 → d5"},
		{"calls a missing one", validLib("top", "nope"), func(*v1alpha1.Workflow) {}, "spec.jobs[1].uses", `no Workflow "nope"`},
		{"no jobs", validLib("lib"), func(w *v1alpha1.Workflow) { w.Spec.Jobs = nil }, "spec.jobs", "must not be empty"},
		{"bad input type", validLib("lib"), func(w *v1alpha1.Workflow) { w.Spec.Inputs[0].Type = "choice" }, "spec.inputs[0].type", "must be one of string, number, boolean"},
		{"default of the wrong type", validLib("lib"), func(w *v1alpha1.Workflow) { w.Spec.Inputs[1].Default = "yes" }, "spec.inputs[1].default", `"yes" is not a boolean`},
		{"duplicate input", validLib("lib"), func(w *v1alpha1.Workflow) { w.Spec.Inputs[1].Name = "N" }, "spec.inputs[1].name", "duplicates spec.inputs[0]"},
		{"output does not parse", validLib("lib"), func(w *v1alpha1.Workflow) { w.Spec.Outputs[0].Value = "${{ jobs.one.outputs. }}" }, "spec.outputs[0].value", "does not parse"},
		{"spec over 64 KiB", validLib("lib"), func(w *v1alpha1.Workflow) {
			for i := range 9 {
				w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: fmt.Sprintf("big%d", i), RunsOn: "bash", Steps: []v1alpha1.Step{{Run: strings.Repeat("x", 8000)}}})
			}
		}, "spec", "bytes of JSON, at most 65536 allowed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.mutate(tt.w)
			wantErr(t, ValidateWorkflow(t.Context(), tt.w, get), tt.field, tt.msg)
		})
	}
}

func TestValidateWorkflowRunUpdate(t *testing.T) {
	old := validWorkflowRun()
	for _, tt := range []struct {
		name   string
		mutate func(*v1alpha1.WorkflowRun)
		field  string
		msg    string
	}{
		{"cancel", func(w *v1alpha1.WorkflowRun) { w.Spec.CancelRequested = true }, "", ""},
		{"ttl", func(w *v1alpha1.WorkflowRun) { w.Spec.TTLSecondsAfterFinished = ptr(int32(60)) }, "", ""},
		{"jobs", func(w *v1alpha1.WorkflowRun) { w.Spec.Jobs = w.Spec.Jobs[:1] }, "spec", "is immutable"},
		{"env", func(w *v1alpha1.WorkflowRun) { w.Spec.Env = nil }, "spec", "is immutable"},
		{"name", func(w *v1alpha1.WorkflowRun) { w.Name = "other" }, "metadata.name", "is immutable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nw := old.DeepCopy()
			tt.mutate(nw)
			wantErr(t, ValidateWorkflowRunUpdate(old, nw), tt.field, tt.msg)
		})
	}
	cancelled := old.DeepCopy()
	cancelled.Spec.CancelRequested = true
	wantErr(t, ValidateWorkflowRunUpdate(cancelled, old), "spec.cancelRequested", "cannot be unset once true")
}

// Without a getter the calls are not followed (a Kubernetes store's CRD
// cannot follow them either): they are checked when the run starts.
func TestValidateWorkflowRunWithoutGetter(t *testing.T) {
	w := validWorkflowRun()
	w.Spec.Jobs = append(w.Spec.Jobs, v1alpha1.Job{ID: "x", Uses: "nope"})
	if err := ValidateWorkflowRun(t.Context(), w, nil); err != nil {
		t.Fatal(err)
	}
}
