package workflow

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/wfexpr"
)

func steps(id string) v1alpha1.Job {
	return v1alpha1.Job{ID: id, RunsOn: "bash", Steps: []v1alpha1.Step{run("true")}}
}

func needing(j v1alpha1.Job, needs ...string) v1alpha1.Job { j.Needs = needs; return j }

func calling(id, wf string, needs ...string) v1alpha1.Job {
	return v1alpha1.Job{ID: id, Uses: wf, Needs: needs}
}

func TestFlatten(t *testing.T) {
	lib := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("x"), needing(steps("y"), "x")}}
	outer := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("a"), needing(calling("in", "lib"), "a")}}
	loopA := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{calling("go", "loop-b")}}
	loopB := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{calling("back", "loop-a")}}
	deep := map[string]*v1alpha1.WorkflowSpec{}
	for i := 1; i <= 5; i++ {
		deep[fmt.Sprintf("d%d", i)] = &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{calling("c", fmt.Sprintf("d%d", i+1))}}
	}
	deep["d6"] = lib
	axis := []apiextensionsv1.JSON{{Raw: []byte(`1`)}, {Raw: []byte(`2`)}}
	matrixCall := calling("m", "lib")
	matrixCall.Strategy = &v1alpha1.Strategy{Matrix: &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "n", Values: axis}}}}
	var many []v1alpha1.Job
	for i := range 40 {
		many = append(many, calling(fmt.Sprintf("c%d", i), "six"))
	}
	six := &v1alpha1.WorkflowSpec{Jobs: []v1alpha1.Job{steps("a"), steps("b"), steps("c"), steps("d"), steps("e"), steps("f")}}

	for _, tc := range []struct {
		name   string
		jobs   []v1alpha1.Job
		called map[string]*v1alpha1.WorkflowSpec
		// ids: each job's flattened id and needs ("id<need,need"); order:
		// the visits ("id" or "id!" for a calling job's end); scopes: each
		// called job's calling job.
		ids, order, scopes string
		err                string
	}{
		{name: "no calls", jobs: []v1alpha1.Job{needing(steps("b"), "a"), steps("a")},
			ids: "b<a a", order: "a b"},
		{name: "one call", jobs: []v1alpha1.Job{steps("build"), calling("call", "lib", "build"), needing(steps("after"), "call")},
			called: map[string]*v1alpha1.WorkflowSpec{"lib": lib},
			ids:    "build call<build call/x call/y<call/x after<call", order: "build call call/x call/y call! after",
			scopes: "call/x:call call/y:call"},
		{name: "nested", jobs: []v1alpha1.Job{calling("o", "outer")},
			called: map[string]*v1alpha1.WorkflowSpec{"outer": outer, "lib": lib},
			ids:    "o o/a o/in<o/a o/in/x o/in/y<o/in/x", order: "o o/a o/in o/in/x o/in/y o/in! o!",
			scopes: "o/a:o o/in:o o/in/x:o/in o/in/y:o/in"},
		{name: "the same Workflow called twice", jobs: []v1alpha1.Job{calling("p", "lib"), calling("q", "lib", "p")},
			called: map[string]*v1alpha1.WorkflowSpec{"lib": lib},
			ids:    "p p/x p/y<p/x q<p q/x q/y<q/x", order: "p p/x p/y p! q q/x q/y q!",
			scopes: "p/x:p p/y:p q/x:q q/y:q"},
		{name: "unknown Workflow", jobs: []v1alpha1.Job{calling("call", "nope")},
			err: `job call: calls Workflow "nope", which this run's snapshot does not hold`},
		{name: "cycle", jobs: []v1alpha1.Job{calling("start", "loop-a")},
			called: map[string]*v1alpha1.WorkflowSpec{"loop-a": loopA, "loop-b": loopB},
			err:    "job start/go/back: Workflow calls form a cycle: loop-a → loop-b → loop-a"},
		{name: "too deep", jobs: []v1alpha1.Job{calling("c", "d1")}, called: deep,
			err: "Workflow calls nest 5 deep, at most 4 allowed: d1 → d2 → d3 → d4 → d5"},
		{name: "matrix on a calling job", jobs: []v1alpha1.Job{matrixCall},
			called: map[string]*v1alpha1.WorkflowSpec{"lib": lib},
			err:    "job m: a job that calls a Workflow cannot have a matrix"},
		{name: "over the instance bound", jobs: many,
			called: map[string]*v1alpha1.WorkflowSpec{"six": six},
			err:    "the run and the Workflows it calls have 280 jobs, at most 256 allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := flatten(&v1alpha1.WorkflowSpec{Jobs: tc.jobs}, tc.called)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids, order, scopes []string
			for _, j := range f.spec.Jobs {
				s := j.ID
				if len(j.Needs) > 0 {
					s += "<" + strings.Join(j.Needs, ",")
				}
				ids = append(ids, s)
				if sc := f.scopeOf[j.ID]; sc.caller != "" {
					scopes = append(scopes, j.ID+":"+sc.caller)
					if !strings.HasPrefix(j.ID, sc.prefix) || sc.local(j.ID) == j.ID {
						t.Errorf("%s: scope prefix %q", j.ID, sc.prefix)
					}
				}
			}
			for _, it := range f.order() {
				s := it.id
				if it.finish {
					s += "!"
				}
				order = append(order, s)
			}
			for what, got := range map[string][2]string{"ids": {strings.Join(ids, " "), tc.ids}, "order": {strings.Join(order, " "), tc.order}, "scopes": {strings.Join(scopes, " "), tc.scopes}} {
				if got[0] != got[1] {
					t.Errorf("%s: %q, want %q", what, got[0], got[1])
				}
			}
		})
	}
}

func TestCallInputs(t *testing.T) {
	decl := []v1alpha1.WorkflowInput{
		{Name: "version", Required: true},
		{Name: "count", Type: "number", Default: "1"},
		{Name: "flag", Type: "boolean"},
		{Name: "label", Default: "none"},
	}
	ctx := &wfexpr.Context{Needs: map[string]wfexpr.JobResult{"build": {Result: "success", Outputs: map[string]string{"v": "1.2", "n": "7", "word": "seven"}}}}
	nv := func(kv ...string) []v1alpha1.NameValue {
		var out []v1alpha1.NameValue
		for i := 0; i < len(kv); i += 2 {
			out = append(out, v1alpha1.NameValue{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		with []v1alpha1.NameValue
		want map[string]any
		err  string
	}{
		{name: "defaults and zero values", with: nv("version", "2"),
			want: map[string]any{"version": "2", "count": float64(1), "flag": false, "label": "none"}},
		{name: "typed from expressions", with: nv("version", "${{ needs.build.outputs.v }}", "count", "${{ needs.build.outputs.n }}", "flag", "${{ needs.build.result == 'success' }}", "LABEL", "x"),
			want: map[string]any{"version": "1.2", "count": float64(7), "flag": true, "label": "x"}},
		{name: "missing required", with: nv("count", "3"), err: `the called Workflow "lib" needs input "version"`},
		{name: "not a number", with: nv("version", "1", "count", "${{ needs.build.outputs.word }}"), err: `input "count" of Workflow "lib": "seven" is not a number`},
		{name: "not a boolean", with: nv("version", "1", "flag", "yes"), err: `input "flag" of Workflow "lib": "yes" is not a boolean (true or false)`},
		{name: "unknown input", with: nv("version", "1", "colour", "red"), err: `the called Workflow "lib" has no input "colour"`},
		{name: "expression fails", with: nv("version", "${{ fromJSON('{') }}"), err: "with.version: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := callInputs("lib", decl, tc.with, ctx)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

// lib is a called Workflow: inputs typed and defaulted, its own env, two
// jobs (pack needs compile) and an output over pack's.
func lib() *v1alpha1.WorkflowSpec {
	return &v1alpha1.WorkflowSpec{
		Inputs: []v1alpha1.WorkflowInput{{Name: "version", Required: true}, {Name: "count", Type: "number"}, {Name: "flag", Type: "boolean", Default: "true"}},
		Env:    []v1alpha1.EnvVar{{Name: "LIBENV", Value: "v=${{ inputs.version }}"}},
		Outputs: []v1alpha1.NameValue{{Name: "artifact", Value: "${{ jobs.pack.outputs.name }}"},
			{Name: "version", Value: "${{ inputs.version }}"}},
		Jobs: []v1alpha1.Job{
			{ID: "compile", RunsOn: "bash", Steps: []v1alpha1.Step{run(`echo "${{ inputs.version }}" "${{ inputs.count }}" "${{ inputs.flag }}"`)}},
			{ID: "pack", RunsOn: "bash", Needs: []string{"compile"}, Steps: []v1alpha1.Step{{ID: "p", Run: "pack"}},
				Outputs: []v1alpha1.NameValue{{Name: "name", Value: "${{ steps.p.outputs.name }}-${{ needs.compile.result }}"}}},
		},
	}
}

// caller is a run that builds, calls lib with build's output, then uses
// lib's output; report runs always.
func caller(count string) v1alpha1.WorkflowRunSpec {
	return v1alpha1.WorkflowRunSpec{
		Env: []v1alpha1.EnvVar{{Name: "STAGE", Value: "ci"}},
		Jobs: []v1alpha1.Job{
			{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{{ID: "s", Run: "build"}},
				Outputs: []v1alpha1.NameValue{{Name: "v", Value: "${{ steps.s.outputs.v }}"}}},
			{ID: "call", Uses: "lib", Needs: []string{"build"},
				With: []v1alpha1.NameValue{{Name: "version", Value: "${{ needs.build.outputs.v }}"}, {Name: "count", Value: count}}},
			{ID: "after", RunsOn: "bash", Needs: []string{"call"}, Steps: []v1alpha1.Step{run(`echo "${{ needs.call.outputs.artifact }}" "${{ needs.call.result }}"`)}},
			{ID: "report", RunsOn: "bash", Needs: []string{"after"}, If: "always()", Steps: []v1alpha1.Step{run("true")}},
		},
	}
}

func newCallSim(t *testing.T, count string) *sim {
	s := newSim(t, caller(count))
	s.called = map[string]*v1alpha1.WorkflowSpec{"lib": lib()}
	return s
}

// byJob is the one pending Run of a job, failing the test otherwise.
func (s *sim) byJob(job string) *v1alpha1.Run {
	s.t.Helper()
	var found []*v1alpha1.Run
	for _, r := range s.pending() {
		if r.Labels[LabelJob] == labelValue(job) {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		s.t.Fatalf("%d pending Runs of %s; %s", len(found), job, s.phases())
	}
	return found[0]
}

func TestWorkflowCallRunsTheCalledJobs(t *testing.T) {
	s := newCallSim(t, "2")
	s.settle()
	s.end(s.byJob("build"), v1alpha1.PhaseSucceeded, 0, map[string]string{"v": "1.2"})
	s.settle()
	if got := s.phases(); got != "build=Succeeded[Succeeded ] call=Running[] call/compile=Running[Pending ] call/pack=Pending[Pending ] after=Pending[Pending ] report=Pending[Pending ] " {
		t.Fatalf("after build: %s", got)
	}
	compile := s.byJob("call/compile")
	for k, want := range map[string]string{"STOKE_EXPR_0": "1.2", "STOKE_EXPR_1": "2", "STOKE_EXPR_2": "true", "LIBENV": "v=1.2", "STOKE_JOB": "call/compile"} {
		if v, _ := envOf(compile, k); v != want {
			t.Errorf("call/compile's %s = %q, want %q", k, v, want)
		}
	}
	if _, ok := envOf(compile, "STAGE"); ok {
		t.Errorf("the caller's env reached the called Workflow's step: %v", compile.Spec.Env)
	}
	if !strings.HasPrefix(compile.Name, "ci-call-compile-a1-s0-") {
		t.Errorf("step Run name %s", compile.Name)
	}
	s.end(compile, v1alpha1.PhaseSucceeded, 0, nil)
	s.settle()
	// after waits for the whole called Workflow, not just its first job.
	if got := s.job("after").Phase; got != v1alpha1.JobPending {
		t.Fatalf("after started before call/pack ended: %s", s.phases())
	}
	s.end(s.byJob("call/pack"), v1alpha1.PhaseSucceeded, 0, map[string]string{"name": "pkg"})
	s.settle()
	call := s.job("call")
	if call.Phase != v1alpha1.JobSucceeded || len(call.Outputs) != 2 || call.Outputs[0].Value != "pkg-success" || call.Outputs[1].Value != "1.2" {
		t.Fatalf("call: %s %v", call.Phase, call.Outputs)
	}
	after := s.byJob("after")
	if v, _ := envOf(after, "STOKE_EXPR_0"); v != "pkg-success" {
		t.Errorf("after saw needs.call.outputs.artifact = %q", v)
	}
	if v, _ := envOf(after, "STOKE_EXPR_1"); v != "success" {
		t.Errorf("after saw needs.call.result = %q", v)
	}
	s.runAll(nil)
	if s.wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("run %s: %s", s.wf.Status.Phase, s.phases())
	}
}

func TestWorkflowCallFailurePropagates(t *testing.T) {
	s := newCallSim(t, "2")
	s.runAll(func(r *v1alpha1.Run) bool {
		if r.Labels[LabelJob] == "call-compile" {
			s.end(r, v1alpha1.PhaseFailed, 1, nil)
			return true
		}
		return false
	})
	if got := s.phases(); got != "build=Succeeded[Succeeded ] call=Failed[] call/compile=Failed[Failed ] call/pack=Skipped[Skipped ] after=Skipped[Skipped ] report=Succeeded[Succeeded ] " {
		t.Errorf("phases %s", got)
	}
	if msg := s.job("call").Message; msg != `Workflow "lib" failed: call/compile` {
		t.Errorf("call's message %q", msg)
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowFailed || !strings.Contains(s.wf.Status.Message, "call/compile") {
		t.Errorf("run %s %q", s.wf.Status.Phase, s.wf.Status.Message)
	}
}

// A calling job that does not start (its need failed; its with: gives an
// input of the wrong type) skips every job of the called Workflow, and
// no step Run is made for them.
func TestWorkflowCallThatDoesNotStart(t *testing.T) {
	for _, tc := range []struct {
		name, count, call, msg string
		buildFails             bool
	}{
		{name: "need failed", count: "2", buildFails: true, call: "Skipped"},
		{name: "wrong input type", count: "${{ needs.build.outputs.v }}x", call: "Failed",
			msg: `calls Workflow "lib": input "count" of Workflow "lib": "1.2x" is not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newCallSim(t, tc.count)
			s.runAll(func(r *v1alpha1.Run) bool {
				if r.Labels[LabelJob] == "build" {
					if tc.buildFails {
						s.end(r, v1alpha1.PhaseFailed, 1, nil)
					} else {
						s.end(r, v1alpha1.PhaseSucceeded, 0, map[string]string{"v": "1.2"})
					}
					return true
				}
				return false
			})
			call := s.job("call")
			if string(call.Phase) != tc.call || call.Message != tc.msg {
				t.Errorf("call: %s %q", call.Phase, call.Message)
			}
			for _, j := range []string{"call/compile", "call/pack"} {
				if js := s.job(j); js.Phase != v1alpha1.JobSkipped || js.Message != "the calling job call did not run" {
					t.Errorf("%s: %s %q", j, js.Phase, js.Message)
				}
			}
			for _, n := range s.order {
				if strings.HasPrefix(n, "ci-call-") {
					t.Errorf("a step Run of the called Workflow was made: %s", n)
				}
			}
			if got := s.job("report").Phase; got != v1alpha1.JobSucceeded {
				t.Errorf("report (always()): %s", got)
			}
			if s.wf.Status.Phase != v1alpha1.WorkflowFailed {
				t.Errorf("run %s", s.wf.Status.Phase)
			}
		})
	}
}

func TestWorkflowCallCancelled(t *testing.T) {
	s := newCallSim(t, "2")
	s.settle()
	s.end(s.byJob("build"), v1alpha1.PhaseSucceeded, 0, map[string]string{"v": "1"})
	s.settle()
	compile := s.byJob("call/compile")
	s.wf.Spec.CancelRequested = true
	s.settle()
	if !compile.Spec.CancelRequested {
		t.Fatalf("the called job's running step was not cancelled")
	}
	if got := s.job("call").Phase; got != v1alpha1.JobRunning {
		t.Errorf("call ended before its jobs did: %s", got)
	}
	s.end(compile, v1alpha1.PhaseCancelled, 143, nil)
	s.runAll(nil)
	if got := s.phases(); got != "build=Succeeded[Succeeded ] call=Cancelled[] call/compile=Cancelled[Cancelled ] call/pack=Skipped[Skipped ] after=Skipped[Skipped ] report=Skipped[Skipped ] " {
		t.Errorf("phases %s", got)
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowCancelled {
		t.Errorf("run %s", s.wf.Status.Phase)
	}
}

// A Workflow run by name (stoke workflow run NAME --set) that calls
// another, which calls a third, passing its own inputs down.
func TestNestedWorkflowCallsFromARunByName(t *testing.T) {
	s := newSim(t, v1alpha1.WorkflowRunSpec{Workflow: "release", Inputs: []v1alpha1.NameValue{{Name: "version", Value: "9"}}})
	s.top = &v1alpha1.WorkflowSpec{
		Inputs:  []v1alpha1.WorkflowInput{{Name: "version", Required: true}},
		Outputs: []v1alpha1.NameValue{{Name: "got", Value: "${{ jobs.ship.outputs.artifact }}"}},
		Jobs:    []v1alpha1.Job{{ID: "ship", Uses: "mid", With: []v1alpha1.NameValue{{Name: "v", Value: "${{ inputs.version }}"}}}},
	}
	s.called = map[string]*v1alpha1.WorkflowSpec{
		"mid": {Inputs: []v1alpha1.WorkflowInput{{Name: "v"}},
			Outputs: []v1alpha1.NameValue{{Name: "artifact", Value: "${{ jobs.inner.outputs.artifact }}"}},
			Jobs:    []v1alpha1.Job{{ID: "inner", Uses: "lib", With: []v1alpha1.NameValue{{Name: "version", Value: "v${{ inputs.v }}"}}}}},
		"lib": lib(),
	}
	s.runAll(func(r *v1alpha1.Run) bool {
		if r.Labels[LabelJob] == "ship-inner-pack" {
			s.end(r, v1alpha1.PhaseSucceeded, 0, map[string]string{"name": "p"})
			return true
		}
		if r.Labels[LabelJob] == "ship-inner-compile" {
			if v, _ := envOf(r, "STOKE_EXPR_0"); v != "v9" {
				t.Errorf("ship/inner/compile saw inputs.version = %q", v)
			}
		}
		return false
	})
	if got := s.phases(); got != "ship=Succeeded[] ship/inner=Succeeded[] ship/inner/compile=Succeeded[Succeeded ] ship/inner/pack=Succeeded[Succeeded ] " {
		t.Errorf("phases %s", got)
	}
	if s.wf.Status.Phase != v1alpha1.WorkflowSucceeded || len(s.wf.Status.Outputs) != 1 || s.wf.Status.Outputs[0].Value != "p-success" {
		t.Errorf("run %s, outputs %v", s.wf.Status.Phase, s.wf.Status.Outputs)
	}
}

// A run whose snapshot lacks a called Workflow (it was deleted before the
// run started) fails at start, naming it, with no job run.
func TestWorkflowCallNotInTheSnapshot(t *testing.T) {
	s := newSim(t, caller("1"))
	s.settle()
	if s.wf.Status.Phase != v1alpha1.WorkflowFailed || s.wf.Status.Reason != "InvalidSpec" ||
		s.wf.Status.Message != `job call: calls Workflow "lib", which this run's snapshot does not hold` || len(s.order) != 0 {
		t.Errorf("run %s %s %q, runs %v", s.wf.Status.Phase, s.wf.Status.Reason, s.wf.Status.Message, s.order)
	}
}
