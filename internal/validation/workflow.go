package validation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/wfexpr"
)

// WorkflowGetter reads a stored Workflow, for the calls (a job's uses, a
// WorkflowRun's spec.workflow) validation follows: it returns an error
// wrapping errdefs.ErrNotFound when there is none. A nil getter skips what
// needs it (the Workflows a spec calls are then checked when the run
// starts).
type WorkflowGetter func(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error)

// workflowIDRE is a job's or step's id, a matrix axis's and an input's or
// output's name: GitHub's identifiers.
var workflowIDRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// StepUses are the step uses: a WorkflowRun knows.
var StepUses = []string{v1alpha1.UsesCheckout, v1alpha1.UsesUploadArtifact, v1alpha1.UsesDownloadArtifact}

// stepShells are the shells a step may name ("" is bash).
var stepShells = []string{"bash", "sh", "python"}

// inputTypes are a Workflow input's types ("" is string).
var inputTypes = []string{"string", "number", "boolean"}

// maxTimeoutMinutes is GitHub's longest job (and step) timeout, and its
// default.
const maxTimeoutMinutes = 360

// SetWorkflowRunDefaults fills in apiVersion, kind and the namespace.
func SetWorkflowRunDefaults(w *v1alpha1.WorkflowRun) {
	if w == nil {
		return
	}
	setTypeMeta(&w.TypeMeta, v1alpha1.KindWorkflowRun)
	if w.Namespace == "" {
		w.Namespace = DefaultNamespace
	}
}

// SetWorkflowDefaults fills in apiVersion, kind and the namespace.
func SetWorkflowDefaults(w *v1alpha1.Workflow) {
	if w == nil {
		return
	}
	setTypeMeta(&w.TypeMeta, v1alpha1.KindWorkflow)
	if w.Namespace == "" {
		w.Namespace = DefaultNamespace
	}
}

// ValidateWorkflowRun checks a WorkflowRun on creation (call
// SetWorkflowRunDefaults first): its name is a DNS-1123 label (its step
// Runs are named from it); exactly one of spec.workflow and spec.jobs; and
// the jobs' DAG, matrices, steps and expressions (see validateJobs). With
// get, it also follows the Workflows the run calls: each must exist,
// calls nest at most bounds.WorkflowCallDepth deep and never in a cycle,
// and with: and inputs fit the called Workflow's inputs. Every problem
// names its field path.
func ValidateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun, get WorkflowGetter) error {
	var e errorList
	if w == nil {
		e.add(field.NewPath("workflowRun"), "must not be nil")
		return e.err()
	}
	if w.Name == "" && w.GenerateName != "" {
		// The store adds five characters, as Kubernetes does.
		named := *w
		named.Name = w.GenerateName + "xxxxx"
		w = &named
	}
	validateWorkflowRun(ctx, &e, w, get)
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(w, v1alpha1.WorkflowRun{TypeMeta: w.TypeMeta, ObjectMeta: w.ObjectMeta, Spec: w.Spec})
}

// ValidateWorkflowRunUpdate checks an update of old to new: the spec is
// immutable but for cancelRequested (which cannot be unset) and
// ttlSecondsAfterFinished; metadata name, namespace and uid are immutable.
func ValidateWorkflowRunUpdate(old, new *v1alpha1.WorkflowRun) error {
	var e errorList
	if old == nil || new == nil {
		e.add(field.NewPath("workflowRun"), "must not be nil")
		return e.err()
	}
	validateObjectMetaUpdate(&e, &old.ObjectMeta, &new.ObjectMeta)
	spec := field.NewPath("spec")
	if old.Spec.CancelRequested && !new.Spec.CancelRequested {
		e.add(spec.Child("cancelRequested"), "cannot be unset once true")
	}
	validateTTL(&e, new.Spec.TTLSecondsAfterFinished, spec.Child("ttlSecondsAfterFinished"))
	o, n := old.Spec, new.Spec
	o.CancelRequested, n.CancelRequested = false, false
	o.TTLSecondsAfterFinished, n.TTLSecondsAfterFinished = nil, nil
	immutable(&e, spec, o, n)
	return e.err()
}

// ValidateWorkflow checks a Workflow on creation or update (call
// SetWorkflowDefaults first): its name is a DNS-1123 label, its inputs
// and outputs, and its jobs as ValidateWorkflowRun checks a run's. With
// get, the Workflows it calls must exist and must not call it back.
func ValidateWorkflow(ctx context.Context, w *v1alpha1.Workflow, get WorkflowGetter) error {
	var e errorList
	if w == nil {
		e.add(field.NewPath("workflow"), "must not be nil")
		return e.err()
	}
	validateTypeMeta(&e, w.TypeMeta, v1alpha1.KindWorkflow)
	validateObjectMeta(&e, &w.ObjectMeta, k8svalidation.IsDNS1123Label)
	validateNoStokeFinalizers(&e, w.Finalizers)
	spec := field.NewPath("spec")
	validateWorkflowSpec(&e, &w.Spec, spec)
	validateSpecSize(&e, &w.Spec, spec)
	if e.err() == nil && get != nil {
		c := &calls{ctx: ctx, get: get, namespace: w.Namespace, seen: map[string]*v1alpha1.WorkflowSpec{}}
		c.count(w.Spec.Jobs)
		c.walk(&e, w.Spec.Jobs, spec.Child("jobs"), nil, []string{w.Name}, 0)
		c.bound(&e, spec.Child("jobs"))
	}
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(w, v1alpha1.Workflow{TypeMeta: w.TypeMeta, ObjectMeta: w.ObjectMeta, Spec: w.Spec})
}

// ValidateWorkflowUpdate checks an update: new must be valid; metadata
// name, namespace and uid are immutable. A running WorkflowRun is not
// affected: it runs the snapshot it took when it started.
func ValidateWorkflowUpdate(ctx context.Context, old, new *v1alpha1.Workflow, get WorkflowGetter) error {
	var e errorList
	if old == nil || new == nil {
		e.add(field.NewPath("workflow"), "must not be nil")
		return e.err()
	}
	validateObjectMetaUpdate(&e, &old.ObjectMeta, &new.ObjectMeta)
	if err := e.err(); err != nil {
		return err
	}
	return ValidateWorkflow(ctx, new, get)
}

func validateWorkflowRun(ctx context.Context, e *errorList, w *v1alpha1.WorkflowRun, get WorkflowGetter) {
	validateTypeMeta(e, w.TypeMeta, v1alpha1.KindWorkflowRun)
	validateObjectMeta(e, &w.ObjectMeta, k8svalidation.IsDNS1123Label)
	validateNoStokeFinalizers(e, w.Finalizers)
	s, spec := &w.Spec, field.NewPath("spec")
	switch {
	case s.Workflow == "" && len(s.Jobs) == 0:
		e.add(spec, "exactly one of workflow or jobs must be set, got neither")
	case s.Workflow != "" && len(s.Jobs) > 0:
		e.add(spec, "exactly one of workflow or jobs must be set, got both")
	case s.Workflow != "":
		for _, msg := range k8svalidation.IsDNS1123Label(s.Workflow) {
			e.add(spec.Child("workflow"), "%s: %s", quote(s.Workflow), msg)
		}
		if len(s.Env) > 0 {
			e.add(spec.Child("env"), "must be empty with workflow (the Workflow's env applies)")
		}
	default:
		if len(s.Inputs) > 0 {
			e.add(spec.Child("inputs"), "are a Workflow's: set them with workflow, not with jobs")
		}
		validateJobs(e, s.Jobs, spec.Child("jobs"))
	}
	validateNameValues(e, s.Inputs, spec.Child("inputs"), bounds.WorkflowInputs, false)
	validateWorkflowEnv(e, s.Env, spec.Child("env"))
	if s.Source != nil {
		validateGitSource(e, s.Source, spec.Child("source"))
	}
	validateTTL(e, s.TTLSecondsAfterFinished, spec.Child("ttlSecondsAfterFinished"))
	if len(s.Jobs) > 0 {
		validateSpecSize(e, s, spec)
	}
	if e.err() != nil || get == nil {
		return
	}
	c := &calls{ctx: ctx, get: get, namespace: w.Namespace, seen: map[string]*v1alpha1.WorkflowSpec{}}
	if s.Workflow == "" {
		c.count(s.Jobs)
		c.walk(e, s.Jobs, spec.Child("jobs"), nil, nil, 0)
		c.bound(e, spec.Child("jobs"))
		return
	}
	called := c.spec(e, s.Workflow, spec.Child("workflow"))
	if called == nil {
		return
	}
	validateCallInputs(e, s.Inputs, called.Inputs, spec.Child("inputs"), s.Workflow)
	c.count(called.Jobs)
	c.walk(e, called.Jobs, spec.Child("jobs"), spec.Child("workflow"), []string{s.Workflow}, 0)
	c.bound(e, spec.Child("workflow"))
}

// validateSpecSize bounds a spec's JSON (bounds.WorkflowSpec): the status
// snapshots called Workflows' specs, and a WorkflowRun's status must stay
// within etcd's object bound.
func validateSpecSize(e *errorList, spec any, p *field.Path) {
	b, err := json.Marshal(spec)
	if err != nil {
		e.add(p, "cannot be encoded: %v", err)
		return
	}
	if len(b) > bounds.WorkflowSpec {
		e.add(p, "is %d bytes of JSON, at most %d allowed", len(b), bounds.WorkflowSpec)
	}
}

func validateWorkflowSpec(e *errorList, s *v1alpha1.WorkflowSpec, spec *field.Path) {
	inputs := spec.Child("inputs")
	if len(s.Inputs) > bounds.WorkflowInputs {
		e.add(inputs, "has %d entries, at most %d allowed", len(s.Inputs), bounds.WorkflowInputs)
	}
	seen := map[string]int{}
	for i, in := range s.Inputs {
		p := inputs.Index(i)
		validateID(e, in.Name, p.Child("name"), bounds.OutputKey)
		if j, dup := seen[strings.ToLower(in.Name)]; dup {
			e.add(p.Child("name"), "%s duplicates %s", quote(in.Name), inputs.Index(j))
		} else {
			seen[strings.ToLower(in.Name)] = i
		}
		if in.Type != "" && !contains(inputTypes, in.Type) {
			e.add(p.Child("type"), "%s: must be one of %s", quote(in.Type), strings.Join(inputTypes, ", "))
		}
		if in.Default != "" {
			if err := inputValue(in.Type, in.Default); err != nil {
				e.add(p.Child("default"), "%v", err)
			}
		}
		if len(in.Default) > bounds.OutputValue {
			e.add(p.Child("default"), "is %d bytes, at most %d allowed", len(in.Default), bounds.OutputValue)
		}
		if len(in.Description) > 1024 {
			e.add(p.Child("description"), "is %d bytes, at most %d allowed", len(in.Description), 1024)
		}
	}
	validateNameValues(e, s.Outputs, spec.Child("outputs"), bounds.OutputKeys, true)
	if len(s.Jobs) == 0 {
		e.add(spec.Child("jobs"), "must not be empty")
	}
	validateJobs(e, s.Jobs, spec.Child("jobs"))
	validateWorkflowEnv(e, s.Env, spec.Child("env"))
}

// inputValue checks a literal value against an input's type (a value with
// an expression is checked when it is evaluated).
func inputValue(typ, v string) error {
	if wfexpr.HasExpressions(v) {
		return nil
	}
	switch typ {
	case "number":
		if _, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
			return fmt.Errorf("%s is not a number", quote(v))
		}
	case "boolean":
		if v != "true" && v != "false" {
			return fmt.Errorf("%s is not a boolean (true or false)", quote(v))
		}
	}
	return nil
}

// validateJobs checks a DAG of jobs: ids, needs (known, no cycle: the
// cycle is named), each job, and the totals bounds.WorkflowJobInstances
// and bounds.WorkflowStepInstances (a matrix job counts once per
// combination; a job that calls a Workflow is counted when the call is
// followed).
func validateJobs(e *errorList, jobs []v1alpha1.Job, p *field.Path) {
	if len(jobs) > bounds.WorkflowJobs {
		e.add(p, "has %d jobs, at most %d allowed", len(jobs), bounds.WorkflowJobs)
		return
	}
	ids := map[string]int{}
	for i, j := range jobs {
		if validateID(e, j.ID, p.Index(i).Child("id"), bounds.WorkflowID) {
			if k, dup := ids[j.ID]; dup {
				e.add(p.Index(i).Child("id"), "%s duplicates %s", quote(j.ID), p.Index(k))
			} else {
				ids[j.ID] = i
			}
		}
	}
	instances, steps := 0, 0
	for i := range jobs {
		n := validateJob(e, &jobs[i], p.Index(i), ids)
		instances += n
		steps += n * len(jobs[i].Steps)
	}
	if instances > bounds.WorkflowJobInstances {
		e.add(p, "make %d job instances (matrix combinations counted), at most %d allowed", instances, bounds.WorkflowJobInstances)
	}
	if steps > bounds.WorkflowStepInstances {
		e.add(p, "make %d steps in all (each matrix combination's counted), at most %d allowed", steps, bounds.WorkflowStepInstances)
	}
	if cycle := needsCycle(jobs, ids); cycle != nil {
		e.add(p, "needs form a cycle: %s", strings.Join(cycle, " → "))
	}
}

// needsCycle returns a cycle of needs (its first job repeated at its
// end), or nil.
func needsCycle(jobs []v1alpha1.Job, ids map[string]int) []string {
	const (
		unvisited = iota
		visiting
		done
	)
	state := make([]int, len(jobs))
	var path []string
	var visit func(i int) []string
	visit = func(i int) []string {
		state[i] = visiting
		path = append(path, jobs[i].ID)
		for _, n := range jobs[i].Needs {
			k, ok := ids[n]
			if !ok {
				continue
			}
			switch state[k] {
			case visiting:
				start := 0
				for path[start] != n {
					start++
				}
				return append(append([]string(nil), path[start:]...), n)
			case unvisited:
				if c := visit(k); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = done
		return nil
	}
	for i := range jobs {
		if state[i] == unvisited {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

// validateJob checks one job and returns its instance count (its matrix's
// combinations; 1 when the matrix does not expand).
func validateJob(e *errorList, j *v1alpha1.Job, p *field.Path, ids map[string]int) int {
	if len(j.Name) > bounds.WorkflowName {
		e.add(p.Child("name"), "is %d bytes, at most %d allowed", len(j.Name), bounds.WorkflowName)
	}
	validateExprs(e, j.Name, p.Child("name"))
	needs := p.Child("needs")
	if len(j.Needs) > bounds.WorkflowJobs {
		e.add(needs, "has %d entries, at most %d allowed", len(j.Needs), bounds.WorkflowJobs)
	}
	seen := map[string]bool{}
	for i, n := range j.Needs {
		switch _, known := ids[n]; {
		case n == j.ID:
			e.add(needs.Index(i), "job %s needs itself", quote(n))
		case !known:
			e.add(needs.Index(i), "no job %s in this workflow", quote(n))
		case seen[n]:
			e.add(needs.Index(i), "%s is listed twice", quote(n))
		}
		seen[n] = true
	}
	validateIf(e, j.If, p.Child("if"))
	validateWorkflowEnv(e, j.Env, p.Child("env"))
	validateTimeout(e, j.TimeoutMinutes, p.Child("timeoutMinutes"))
	validateRetryPolicy(e, j.RetryPolicy, p.Child("retryPolicy"))
	validateNameValues(e, j.Outputs, p.Child("outputs"), bounds.OutputKeys, true)
	switch {
	case j.Uses == "" && len(j.Steps) == 0:
		e.add(p, "exactly one of steps or uses must be set, got neither")
	case j.Uses != "" && len(j.Steps) > 0:
		e.add(p, "exactly one of steps or uses must be set, got both")
	case j.Uses != "":
		for _, msg := range k8svalidation.IsDNS1123Label(j.Uses) {
			e.add(p.Child("uses"), "%s must name a Workflow: %s", quote(j.Uses), msg)
		}
		if j.RunsOn != "" {
			e.add(p.Child("runsOn"), "must be empty with uses (the called Workflow's jobs say where they run)")
		}
		// A calling job is a node of the DAG whose work is the called
		// Workflow's jobs: what would shape its own steps has no meaning,
		// as in GitHub. A matrix of calls is refused, not built (one scope
		// per combination would multiply the called jobs past the
		// status bounds quickly).
		if j.Strategy != nil {
			e.add(p.Child("strategy"), "a job that calls a Workflow (uses) cannot have a strategy or matrix: call it from one job, or give the matrix to the called Workflow's jobs")
		}
		if len(j.Env) > 0 {
			e.add(p.Child("env"), "must be empty with uses (pass values to the called Workflow with with:)")
		}
		if j.TimeoutMinutes != 0 {
			e.add(p.Child("timeoutMinutes"), "must be empty with uses (the called Workflow's jobs have their own)")
		}
		if j.RetryPolicy != nil {
			e.add(p.Child("retryPolicy"), "must be empty with uses (the called Workflow's jobs have their own)")
		}
		if len(j.Outputs) > 0 {
			e.add(p.Child("outputs"), "must be empty with uses (the job's outputs are the called Workflow's)")
		}
		validateNameValues(e, j.With, p.Child("with"), bounds.WorkflowInputs, true)
	default:
		if len(j.With) > 0 {
			e.add(p.Child("with"), "is for uses: a job with steps takes none")
		}
		validateRunsOn(e, j.RunsOn, p.Child("runsOn"))
		validateSteps(e, j.Steps, p.Child("steps"))
	}
	instances := 1
	if st := j.Strategy; st != nil {
		sp := p.Child("strategy")
		if st.MaxParallel < 0 || st.MaxParallel > bounds.WorkflowMatrix {
			e.add(sp.Child("maxParallel"), "is %d, must be 0–%d (0 means all at once)", st.MaxParallel, bounds.WorkflowMatrix)
		}
		if st.Matrix != nil {
			seenAxes := map[string]int{}
			for i, a := range st.Matrix.Axes {
				ap := sp.Child("matrix", "axes").Index(i).Child("name")
				if validateID(e, a.Name, ap, bounds.WorkflowID) {
					if k, dup := seenAxes[strings.ToLower(a.Name)]; dup {
						e.add(ap, "%s duplicates axes[%d]", quote(a.Name), k)
					}
					seenAxes[strings.ToLower(a.Name)] = i
				}
			}
			combos, err := wfexpr.ExpandMatrix(st.Matrix)
			if err != nil {
				e.add(sp.Child("matrix"), "%v", err)
			} else {
				instances = len(combos)
			}
		}
	}
	return instances
}

// validateRunsOn checks a job's Runtime: a DNS-1123 label, or an
// expression (${{ matrix.runtime }}) the engine evaluates per instance.
func validateRunsOn(e *errorList, r string, p *field.Path) {
	switch {
	case r == "":
		e.add(p, "must name a Runtime")
	case wfexpr.HasExpressions(r):
		validateExprs(e, r, p)
	default:
		for _, msg := range k8svalidation.IsDNS1123Label(r) {
			e.add(p, "%s: %s", quote(r), msg)
		}
	}
}

func validateSteps(e *errorList, steps []v1alpha1.Step, p *field.Path) {
	if len(steps) > bounds.WorkflowSteps {
		e.add(p, "has %d steps, at most %d allowed", len(steps), bounds.WorkflowSteps)
		return
	}
	ids := map[string]int{}
	for i := range steps {
		s, sp := &steps[i], p.Index(i)
		if s.ID != "" && validateID(e, s.ID, sp.Child("id"), bounds.WorkflowID) {
			if k, dup := ids[s.ID]; dup {
				e.add(sp.Child("id"), "%s duplicates %s", quote(s.ID), p.Index(k))
			} else {
				ids[s.ID] = i
			}
		}
		if len(s.Name) > bounds.WorkflowName {
			e.add(sp.Child("name"), "is %d bytes, at most %d allowed", len(s.Name), bounds.WorkflowName)
		}
		validateExprs(e, s.Name, sp.Child("name"))
		validateIf(e, s.If, sp.Child("if"))
		switch {
		case s.Run == "" && s.Uses == "":
			e.add(sp, "exactly one of run or uses must be set, got neither")
		case s.Run != "" && s.Uses != "":
			e.add(sp, "exactly one of run or uses must be set, got both")
		case s.Uses != "":
			if !contains(StepUses, s.Uses) {
				e.add(sp.Child("uses"), "%s is not a step Stoke knows: uses must be one of %s", quote(s.Uses), strings.Join(StepUses, ", "))
			}
			if s.Shell != "" {
				e.add(sp.Child("shell"), "is for run: a uses step takes none")
			}
		default:
			if len(s.Run) > bounds.WorkflowRunScript {
				e.add(sp.Child("run"), "is %d bytes, at most %d allowed", len(s.Run), bounds.WorkflowRunScript)
			}
			if strings.IndexByte(s.Run, 0) >= 0 {
				e.add(sp.Child("run"), "contains a NUL byte")
			}
			validateExprs(e, s.Run, sp.Child("run"))
			if len(s.With) > 0 {
				e.add(sp.Child("with"), "is for uses: a run step takes none")
			}
		}
		if s.Shell != "" && !contains(stepShells, s.Shell) {
			e.add(sp.Child("shell"), "%s: must be one of %s", quote(s.Shell), strings.Join(stepShells, ", "))
		}
		validateWorkflowEnv(e, s.Env, sp.Child("env"))
		if wd := s.WorkingDirectory; wd != "" {
			if wfexpr.HasExpressions(wd) {
				validateExprs(e, wd, sp.Child("workingDirectory"))
			} else if clean := strings.TrimSuffix(strings.TrimSuffix(wd, "/."), "/"); clean != "." {
				// The workspace itself is fine, as for a git source's path.
				e.addErr(RelativePath(sp.Child("workingDirectory").String(), clean))
			}
		}
		validateNameValues(e, s.With, sp.Child("with"), bounds.WorkflowInputs, true)
		validateTimeout(e, s.TimeoutMinutes, sp.Child("timeoutMinutes"))
	}
}

func validateTimeout(e *errorList, m int32, p *field.Path) {
	if m < 0 || m > maxTimeoutMinutes {
		e.add(p, "is %d, must be 0–%d (0 means %d)", m, maxTimeoutMinutes, maxTimeoutMinutes)
	}
}

// validateID checks an identifier (GitHub's: [A-Za-z_][A-Za-z0-9_-]*).
func validateID(e *errorList, id string, p *field.Path, max int) bool {
	switch {
	case id == "":
		e.add(p, "must not be empty")
	case len(id) > max:
		e.add(p, "is %d bytes, at most %d allowed", len(id), max)
	case !workflowIDRE.MatchString(id):
		e.add(p, "%s must match [A-Za-z_][A-Za-z0-9_-]*", quote(id))
	default:
		return true
	}
	return false
}

// validateNameValues checks inputs, with: and outputs: unique names,
// bounded values, and (exprs) values whose expressions parse.
func validateNameValues(e *errorList, nvs []v1alpha1.NameValue, p *field.Path, max int, exprs bool) {
	if len(nvs) > max {
		e.add(p, "has %d entries, at most %d allowed", len(nvs), max)
		return
	}
	seen := map[string]int{}
	for i, nv := range nvs {
		ep := p.Index(i)
		if validateID(e, nv.Name, ep.Child("name"), bounds.OutputKey) {
			if k, dup := seen[strings.ToLower(nv.Name)]; dup {
				e.add(ep.Child("name"), "%s duplicates %s", quote(nv.Name), p.Index(k))
			} else {
				seen[strings.ToLower(nv.Name)] = i
			}
		}
		if len(nv.Value) > bounds.OutputValue {
			e.add(ep.Child("value"), "is %d bytes, at most %d allowed", len(nv.Value), bounds.OutputValue)
		}
		if exprs {
			validateExprs(e, nv.Value, ep.Child("value"))
		}
	}
}

// validateWorkflowEnv is a Run's env rule, with values that may hold
// expressions.
func validateWorkflowEnv(e *errorList, env []v1alpha1.EnvVar, p *field.Path) {
	validateEnv(e, env, p)
	for i, v := range env {
		validateExprs(e, v.Value, p.Index(i).Child("value"))
	}
}

// validateIf checks an if: (a bare expression, or one in ${{ }}).
func validateIf(e *errorList, cond string, p *field.Path) {
	if strings.TrimSpace(cond) == "" {
		return
	}
	x, err := wfexpr.Parse(cond)
	if err != nil {
		e.add(p, "%s does not parse: %v", quote(cond), err)
		return
	}
	refuseHashFiles(e, x.CallsHashFiles(), p)
}

// hashFilesFields are the fields where hashFiles() may be called: a
// step's if, run, env and with (GitHub's rule; the engine hashes in the
// job's workspace before the step starts).
var hashFilesFields = regexp.MustCompile(`\.steps\[[0-9]+\]\.(if|run|env\[[0-9]+\]\.value|with\[[0-9]+\]\.value)$`)

func refuseHashFiles(e *errorList, calls bool, p *field.Path) {
	if calls && !hashFilesFields.MatchString(p.String()) {
		e.add(p, "calls hashFiles, which is only available in a step's if, run, env and with")
	}
}

// validateExprs checks the ${{ }} expressions in a string.
func validateExprs(e *errorList, s string, p *field.Path) {
	if !wfexpr.HasExpressions(s) {
		return
	}
	t, err := wfexpr.ParseTemplate(s)
	if err == nil {
		refuseHashFiles(e, t.CallsHashFiles(), p)
		return
	}
	var xe *wfexpr.Error
	if errors.As(err, &xe) {
		lo := max(0, xe.Offset-bounds.Quoted/2)
		e.add(p, "an expression does not parse, near %s: %s", quote(s[lo:min(len(s), lo+bounds.Quoted)]), xe.Msg)
		return
	}
	e.add(p, "%v", err)
}

// validateCallInputs checks a call's with: (or a run's inputs) against the
// called Workflow's inputs: each named input exists, each required one
// without a default is given, and literal values fit their type.
func validateCallInputs(e *errorList, with []v1alpha1.NameValue, inputs []v1alpha1.WorkflowInput, p *field.Path, name string) {
	given := map[string]bool{}
	for i, nv := range with {
		given[strings.ToLower(nv.Name)] = true
		var in *v1alpha1.WorkflowInput
		for k := range inputs {
			if strings.EqualFold(inputs[k].Name, nv.Name) {
				in = &inputs[k]
			}
		}
		if in == nil {
			e.add(p.Index(i).Child("name"), "Workflow %s has no input %s", quote(name), quote(nv.Name))
			continue
		}
		if err := inputValue(in.Type, nv.Value); err != nil {
			e.add(p.Index(i).Child("value"), "input %s of Workflow %s: %v", quote(in.Name), quote(name), err)
		}
	}
	for _, in := range inputs {
		if in.Required && in.Default == "" && !given[strings.ToLower(in.Name)] {
			e.add(p, "Workflow %s needs input %s", quote(name), quote(in.Name))
		}
	}
}

// calls follows the Workflows a spec calls, depth first.
type calls struct {
	ctx       context.Context
	get       WorkflowGetter
	namespace string
	seen      map[string]*v1alpha1.WorkflowSpec // nil value: not found
	// jobs, instances and steps count what a run lays out: its jobs and
	// every called Workflow's, once per call (the engine's flatten).
	jobs, instances, steps int
	called                 bool
}

// count adds jobs to the layout: each matrix combination an instance,
// with its steps.
func (c *calls) count(jobs []v1alpha1.Job) {
	for i := range jobs {
		n := 1
		if st := jobs[i].Strategy; st != nil && st.Matrix != nil {
			if combos, err := wfexpr.ExpandMatrix(st.Matrix); err == nil {
				n = max(len(combos), 1)
			}
		}
		c.jobs++
		c.instances += n
		c.steps += n * len(jobs[i].Steps)
	}
}

// bound refuses a layout over what one WorkflowRun's status holds; a spec
// that calls nothing was bounded by validateJobs already.
func (c *calls) bound(e *errorList, p *field.Path) {
	switch {
	case !c.called:
	case c.jobs > bounds.WorkflowJobInstances || c.instances > bounds.WorkflowJobInstances:
		e.add(p, "with the Workflows they call, make %d jobs and %d job instances (matrix combinations counted), at most %d allowed", c.jobs, c.instances, bounds.WorkflowJobInstances)
	case c.steps > bounds.WorkflowStepInstances:
		e.add(p, "with the Workflows they call, make %d steps in all, at most %d allowed", c.steps, bounds.WorkflowStepInstances)
	}
}

// spec reads a called Workflow (once), adding the problem when it is not
// there.
func (c *calls) spec(e *errorList, name string, p *field.Path) *v1alpha1.WorkflowSpec {
	if s, ok := c.seen[name]; ok {
		if s == nil {
			e.add(p, "no Workflow %s in namespace %s", quote(name), quote(c.namespace))
		}
		return s
	}
	if len(c.seen) >= bounds.WorkflowCalled {
		e.add(p, "calls more than %d distinct Workflows", bounds.WorkflowCalled)
		return nil
	}
	wf, err := c.get(c.ctx, c.namespace, name)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		c.seen[name] = nil
		e.add(p, "no Workflow %s in namespace %s", quote(name), quote(c.namespace))
		return nil
	case err != nil:
		e.addErr(fmt.Errorf("%s: reading Workflow %s: %w", p, quote(name), err))
		return nil
	}
	c.seen[name] = &wf.Spec
	return &wf.Spec
}

// walk checks the calls of jobs, which chain (the Workflows above them,
// outermost first) reaches at depth. Problems in this object's own jobs
// (at nil) name their uses field; deeper ones name at, the field of this
// object the call chain starts from.
func (c *calls) walk(e *errorList, jobs []v1alpha1.Job, p *field.Path, at *field.Path, chain []string, depth int) {
	for i, j := range jobs {
		if j.Uses == "" {
			continue
		}
		up := at
		if up == nil {
			up = p.Index(i).Child("uses")
		}
		next := append(append([]string(nil), chain...), j.Uses)
		if contains(chain, j.Uses) {
			e.add(up, "Workflow calls form a cycle: %s", strings.Join(next, " → "))
			continue
		}
		if depth+1 > bounds.WorkflowCallDepth {
			e.add(up, "Workflow calls nest %d deep, at most %d allowed: %s", depth+1, bounds.WorkflowCallDepth, strings.Join(next, " → "))
			continue
		}
		called := c.spec(e, j.Uses, up)
		if called == nil {
			continue
		}
		if at == nil {
			validateCallInputs(e, j.With, called.Inputs, p.Index(i).Child("with"), j.Uses)
		}
		c.called = true
		c.count(called.Jobs)
		c.walk(e, called.Jobs, p, up, next, depth+1)
	}
}
