package workflow

import (
	"fmt"
	"strconv"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/wfexpr"
)

// maxFlatID bounds a called job's id once its callers prefix it
// ("outer/inner/build"): JobStatus.Job's bound in the CRD.
const maxFlatID = 255

// callScope is one Workflow's jobs inside a WorkflowRun: the run's own
// (the top scope) or a called Workflow's, whose jobs are named under the
// job that calls it ("call/build", "outer/inner/build").
type callScope struct {
	// prefix is "" for the top scope, else the calling job's id and '/'.
	prefix string
	// caller is the calling job's (flattened) id; "" for the top scope.
	caller string
	parent *callScope
	// workflow is the called Workflow's name ("" for the top scope).
	workflow string
	// spec is the Workflow's spec: its inputs, outputs and env.
	spec *v1alpha1.WorkflowSpec
	// jobs are the scope's own jobs' flattened ids, in spec order (the
	// jobs of the Workflows they call are in those scopes).
	jobs []string
}

// local is a flattened id as the scope's own expressions name it.
func (s *callScope) local(id string) string { return strings.TrimPrefix(id, s.prefix) }

// flat is a WorkflowRun's spec with its Workflow calls laid out as one
// DAG: every called job is a job of its own, under its scope's prefix,
// with its needs mapped inside the scope. A calling job stays a node: it
// starts (its if: and with: decided in its caller's context) before its
// scope's jobs may start, and ends, with the called Workflow's outputs,
// once every one of them has ended; jobs that need it wait for that.
type flat struct {
	// spec has every job; its env, inputs and outputs are the top scope's.
	spec *v1alpha1.WorkflowSpec
	top  *callScope
	// scopeOf is the scope a job is in, by flattened id; calls the scope
	// a calling job opens.
	scopeOf map[string]*callScope
	calls   map[string]*callScope
	called  map[string]*v1alpha1.WorkflowSpec
}

// flatten lays out spec's jobs and those of the Workflows they call
// (called: by name, as the run's snapshot holds them), depth first, to
// bounds.WorkflowCallDepth; it refuses a call cycle, an unknown Workflow,
// a calling job with a matrix, and a layout over the status bounds.
func flatten(spec *v1alpha1.WorkflowSpec, called map[string]*v1alpha1.WorkflowSpec) (*flat, error) {
	f := &flat{
		spec:    &v1alpha1.WorkflowSpec{Inputs: spec.Inputs, Outputs: spec.Outputs, Env: spec.Env},
		top:     &callScope{spec: spec},
		scopeOf: map[string]*callScope{},
		calls:   map[string]*callScope{},
		called:  called,
	}
	if err := f.add(f.top, spec.Jobs, nil); err != nil {
		return nil, err
	}
	return f, nil
}

// add lays out jobs in scope s; chain are the Workflows above it.
func (f *flat) add(s *callScope, jobs []v1alpha1.Job, chain []string) error {
	for i := range jobs {
		j := jobs[i] // a copy: its needs are rewritten
		id := s.prefix + j.ID
		if len(id) > maxFlatID {
			return fmt.Errorf("job %s: the calling jobs' ids and its own make an id of %d bytes, at most %d allowed", id, len(id), maxFlatID)
		}
		j.ID = id
		j.Needs = make([]string, len(jobs[i].Needs))
		for k, n := range jobs[i].Needs {
			j.Needs[k] = s.prefix + n
		}
		f.spec.Jobs = append(f.spec.Jobs, j)
		f.scopeOf[id] = s
		s.jobs = append(s.jobs, id)
		if j.Uses == "" {
			continue
		}
		next := append(append([]string(nil), chain...), j.Uses)
		switch {
		case callsAgain(chain, j.Uses):
			return fmt.Errorf("job %s: Workflow calls form a cycle: %s", id, strings.Join(next, " → "))
		case len(next) > bounds.WorkflowCallDepth:
			return fmt.Errorf("job %s: Workflow calls nest %d deep, at most %d allowed: %s", id, len(next), bounds.WorkflowCallDepth, strings.Join(next, " → "))
		case j.Strategy != nil && j.Strategy.Matrix != nil:
			return fmt.Errorf("job %s: a job that calls a Workflow cannot have a matrix", id)
		}
		cs := f.called[j.Uses]
		if cs == nil {
			return fmt.Errorf("job %s: calls Workflow %q, which this run's snapshot does not hold", id, j.Uses)
		}
		scope := &callScope{prefix: id + "/", caller: id, parent: s, workflow: j.Uses, spec: cs}
		f.calls[id] = scope
		if err := f.add(scope, cs.Jobs, next); err != nil {
			return err
		}
	}
	if s == f.top {
		return f.check()
	}
	return nil
}

func callsAgain(chain []string, name string) bool {
	for _, c := range chain {
		if c == name {
			return true
		}
	}
	return false
}

// check bounds the layout as validation bounds one spec: the job
// instances (matrix combinations counted) and their steps, which
// status.jobs holds.
func (f *flat) check() error {
	if len(f.spec.Jobs) > bounds.WorkflowJobInstances {
		return fmt.Errorf("the run and the Workflows it calls have %d jobs, at most %d allowed", len(f.spec.Jobs), bounds.WorkflowJobInstances)
	}
	instances, steps := 0, 0
	for i := range f.spec.Jobs {
		j := &f.spec.Jobs[i]
		n := 1
		if j.Strategy != nil && j.Strategy.Matrix != nil {
			combos, err := wfexpr.ExpandMatrix(j.Strategy.Matrix)
			if err != nil {
				return fmt.Errorf("job %s: strategy.matrix: %w", j.ID, err)
			}
			n = max(len(combos), 1)
		}
		instances += n
		steps += n * len(j.Steps)
	}
	if instances > bounds.WorkflowJobInstances {
		return fmt.Errorf("the run and the Workflows it calls make %d job instances (matrix combinations counted), at most %d allowed", instances, bounds.WorkflowJobInstances)
	}
	if steps > bounds.WorkflowStepInstances {
		return fmt.Errorf("the run and the Workflows it calls make %d steps in all, at most %d allowed", steps, bounds.WorkflowStepInstances)
	}
	return nil
}

// layout is a spec laid out for decisions: flatten's result (or its
// refusal), the order a decision visits the jobs, and the jobs by id. It
// depends on the spec and the Workflows it calls alone, and nothing a
// decision does changes it, so the controller keeps one between the
// decisions of a WorkflowRun's generation (memo.layoutFor) instead of
// flattening on every decision.
type layout struct {
	flat  *flat
	err   error
	order []orderItem
	jobs  map[string]*v1alpha1.Job
	// ancestors are the jobs each job needs, directly or not, sorted.
	ancestors map[string][]string
}

func newLayout(spec *v1alpha1.WorkflowSpec, called map[string]*v1alpha1.WorkflowSpec) *layout {
	f, err := flatten(spec, called)
	if err != nil {
		return &layout{err: err}
	}
	l := &layout{flat: f, order: f.order(), jobs: make(map[string]*v1alpha1.Job, len(f.spec.Jobs))}
	l.ancestors = make(map[string][]string, len(f.spec.Jobs))
	for i := range f.spec.Jobs {
		id := f.spec.Jobs[i].ID
		l.jobs[id] = &f.spec.Jobs[i]
		l.ancestors[id] = ancestors(f.spec, id)
	}
	return l
}

// orderItem is one job in the order a decision visits them; finish is
// a calling job's second visit, after its scope's jobs.
type orderItem struct {
	id     string
	finish bool
}

// order is the order a decision visits jobs: a job after those it needs;
// a calling job, then its scope's jobs, then the calling job again (to
// end it when they have), so that a call starts, runs and ends within
// one decision when it can, and jobs needing it see it end.
func (f *flat) order() []orderItem {
	byID := map[string]*v1alpha1.Job{}
	for i := range f.spec.Jobs {
		byID[f.spec.Jobs[i].ID] = &f.spec.Jobs[i]
	}
	seen := map[string]bool{}
	var out []orderItem
	var visit func(id string)
	visit = func(id string) {
		j := byID[id]
		if j == nil || seen[id] {
			return
		}
		seen[id] = true // before its needs: validation refuses cycles, this guards anyway
		for _, n := range j.Needs {
			visit(n)
		}
		out = append(out, orderItem{id: id})
		if s := f.calls[id]; s != nil {
			for _, c := range s.jobs {
				visit(c)
			}
			out = append(out, orderItem{id: id, finish: true})
		}
	}
	for _, id := range f.top.jobs {
		visit(id)
	}
	return out
}

// callInputs is a called Workflow's inputs context: with: evaluated in
// the calling job's context, each input typed as declared (number:
// float64, boolean: bool, string), defaulted, and required; an input the
// Workflow does not declare is refused.
func callInputs(name string, decl []v1alpha1.WorkflowInput, with []v1alpha1.NameValue, ctx *wfexpr.Context) (map[string]any, error) {
	given := map[string]string{}
	for _, nv := range with {
		known := false
		for _, in := range decl {
			known = known || strings.EqualFold(in.Name, nv.Name)
		}
		if !known {
			return nil, fmt.Errorf("the called Workflow %q has no input %q", name, nv.Name)
		}
		v, err := wfexpr.EvalString(nv.Value, ctx)
		if err != nil {
			return nil, fmt.Errorf("with.%s: %w", nv.Name, err)
		}
		given[strings.ToLower(nv.Name)] = v
	}
	out := map[string]any{}
	for _, in := range decl {
		v, ok := given[strings.ToLower(in.Name)]
		if !ok {
			if in.Required && in.Default == "" {
				return nil, fmt.Errorf("the called Workflow %q needs input %q", name, in.Name)
			}
			v = in.Default
		}
		tv, err := typedInput(in.Type, v, ok || in.Default != "")
		if err != nil {
			return nil, fmt.Errorf("input %q of Workflow %q: %w", in.Name, name, err)
		}
		out[in.Name] = tv
	}
	return out, nil
}

// typedInput is v as an input of type typ; an input neither given nor
// defaulted is its type's zero value, as GitHub's are.
func typedInput(typ, v string, set bool) (any, error) {
	switch typ {
	case "number":
		if !set {
			return float64(0), nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", bounds.Truncate(v, bounds.Quoted))
		}
		return f, nil
	case "boolean":
		switch {
		case !set:
			return false, nil
		case v == "true":
			return true, nil
		case v == "false":
			return false, nil
		}
		return nil, fmt.Errorf("%q is not a boolean (true or false)", bounds.Truncate(v, bounds.Quoted))
	}
	return v, nil
}
