package workflow

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/wfexpr"
)

// Step kinds a `uses:` names.
const (
	usesCheckout = "checkout"
	usesUpload   = "upload-artifact"
	usesDownload = "download-artifact"
)

// defaultJobTimeout is a job's limit when it sets no timeoutMinutes:
// GitHub's 360 minutes.
const defaultJobTimeout = 360 * time.Minute

// GitHub's step and job results (outcome, conclusion, needs.<id>.result).
const (
	resultSuccess   = "success"
	resultFailure   = "failure"
	resultCancelled = "cancelled"
	resultSkipped   = "skipped"
)

// world is what one decision about a WorkflowRun sees.
type world struct {
	now  time.Time
	wf   *v1alpha1.WorkflowRun
	spec *v1alpha1.WorkflowSpec
	// run returns the step Run of this name in the WorkflowRun's
	// namespace, if the informer has it.
	run func(name string) (*v1alpha1.Run, bool)
	// server returns the server of a Runtime ("bash", "python",
	// "lambda"), or "" when it is not known.
	server func(runtime string) string
	// artifact returns what became of an artifact step started earlier
	// (by its key), if anything did yet.
	artifact func(key string) (artifactResult, bool)
	// copying reports whether an artifact step's copy is in flight (by
	// its key): its hold Run may end before the copy's result is back.
	copying func(key string) bool
	// invalid is why validation refuses the WorkflowRun, when it has not
	// started yet; "" when it does not.
	invalid string
	// notBefore returns when a job instance waiting for its next attempt
	// may start it (kept in memory: after a restart it starts at once).
	notBefore func(instance string) time.Time
	// called are the Workflows the jobs call, by name, as the run's
	// snapshot holds them.
	called map[string]*v1alpha1.WorkflowSpec
	// layout is spec and called laid out, when the caller kept one from
	// an earlier decision; nil: decide lays them out.
	layout *layout

	// Set by decide: the spec with its calls laid out (spec is then
	// flat.spec), the called scopes' inputs as evaluated so far, and how
	// many instances of each job have failed so far (strategy.failFast).
	flat   *flat
	inputs map[*callScope]scopeInputs
	failed map[string]int
}

// scopeInputs is a scope's inputs context, or why its with: fails.
type scopeInputs struct {
	values map[string]any
	err    error
}

// plan is what a decision asks the controller to do, in order: create the
// Runs, request the cancels, start the artifact steps, then write status.
type plan struct {
	status    v1alpha1.WorkflowRunStatus
	create    []*v1alpha1.Run
	cancel    []string
	artifacts []artifactOp
	// retryAt are instances waiting for their next attempt, and when.
	retryAt map[string]time.Time
	// wake is when to decide again although nothing changes (a timeout,
	// a retry's backoff); zero for never.
	wake time.Time
}

func (p *plan) wakeAt(t time.Time) {
	if !t.IsZero() && (p.wake.IsZero() || t.Before(p.wake)) {
		p.wake = t
	}
}

// decide is the controller's one decision: from the WorkflowRun's spec
// snapshot, its status as last written and the step Runs it sees, the
// next status and what to do. It is a pure function of w.
func decide(w *world) *plan {
	p := &plan{status: *w.wf.Status.DeepCopy(), retryAt: map[string]time.Time{}}
	st := &p.status
	if st.Phase.Terminal() {
		return p
	}
	if st.Phase == "" || st.Phase == v1alpha1.WorkflowPending {
		st.Phase = v1alpha1.WorkflowRunning
		t := metav1.NewTime(w.now)
		st.StartTime = &t
	}
	st.ObservedGeneration = w.wf.Generation
	if w.invalid != "" {
		finish(st, w.now, v1alpha1.WorkflowFailed, "InvalidSpec", w.invalid)
		return p
	}
	lay := w.layout
	if lay == nil {
		lay = newLayout(w.spec, w.called)
	}
	if lay.err != nil {
		finish(st, w.now, v1alpha1.WorkflowFailed, "InvalidSpec", lay.err.Error())
		return p
	}
	f := lay.flat
	wc := *w
	wc.spec, wc.flat, wc.layout, wc.inputs, wc.failed = f.spec, f, lay, map[*callScope]scopeInputs{}, map[string]int{}
	w = &wc
	if len(st.Jobs) == 0 {
		jobs, err := expandJobs(w.spec)
		if err != nil {
			finish(st, w.now, v1alpha1.WorkflowFailed, "InvalidSpec", err.Error())
			return p
		}
		st.Jobs = jobs
	}
	// Each job's instances, in status order, and its failed ones (one
	// pass, not one per job or per instance).
	instances := make(map[string][]int, len(lay.jobs))
	for i := range st.Jobs {
		instances[st.Jobs[i].Job] = append(instances[st.Jobs[i].Job], i)
		if st.Jobs[i].Phase == v1alpha1.JobFailed {
			w.failed[st.Jobs[i].Job]++
		}
	}
	// Jobs in an order where needs come first, a called Workflow's jobs
	// between their calling job's start and its end (flat.order).
	for _, it := range lay.order {
		job := lay.jobs[it.id]
		for idx, i := range instances[it.id] {
			d := &jobDecider{w: w, p: p, job: job, js: &st.Jobs[i], index: idx, scope: f.scopeOf[it.id]}
			if it.finish {
				d.finishCall()
			} else {
				d.decide()
			}
		}
	}
	done := true
	anyFailed := false
	for _, js := range st.Jobs {
		switch js.Phase {
		case v1alpha1.JobSucceeded, v1alpha1.JobSkipped:
		case v1alpha1.JobFailed, v1alpha1.JobCancelled:
			anyFailed = true
		default:
			done = false
		}
	}
	if !done {
		return p
	}
	st.Outputs = scopeOutputs(w, st, w.flat.top)
	switch {
	case w.wf.Spec.CancelRequested:
		finish(st, w.now, v1alpha1.WorkflowCancelled, "Cancelled", "cancelled on request")
	case anyFailed:
		finish(st, w.now, v1alpha1.WorkflowFailed, "JobFailed", failedJobs(st))
	default:
		finish(st, w.now, v1alpha1.WorkflowSucceeded, "Succeeded", "")
	}
	return p
}

func finish(st *v1alpha1.WorkflowRunStatus, now time.Time, phase v1alpha1.WorkflowPhase, reason, msg string) {
	st.Phase, st.Reason, st.Message = phase, reason, bounds.Truncate(msg, bounds.Message)
	t := metav1.NewTime(now)
	st.CompletionTime = &t
}

func failedJobs(st *v1alpha1.WorkflowRunStatus) string {
	var names []string
	for _, js := range st.Jobs {
		if js.Phase == v1alpha1.JobFailed {
			names = append(names, js.Name)
		}
	}
	return "failed: " + strings.Join(names, ", ")
}

// maxInstanceName is JobStatus.Name's bound in the CRD.
const maxInstanceName = 512

// expandJobs is the status.jobs of a WorkflowRun that starts: every job's
// matrix instances, in spec order, Pending, with their steps Pending.
func expandJobs(spec *v1alpha1.WorkflowSpec) ([]v1alpha1.JobStatus, error) {
	var out []v1alpha1.JobStatus
	for i := range spec.Jobs {
		job := &spec.Jobs[i]
		var m *v1alpha1.Matrix
		if job.Strategy != nil {
			m = job.Strategy.Matrix
		}
		combos, err := wfexpr.ExpandMatrix(m)
		if err != nil {
			return nil, fmt.Errorf("job %s: strategy.matrix: %w", job.ID, err)
		}
		if len(combos) == 0 {
			// GitHub: a matrix with no combination runs nothing; the job
			// counts as skipped.
			out = append(out, v1alpha1.JobStatus{Name: job.ID, Job: job.ID, Phase: v1alpha1.JobSkipped, Message: "its matrix has no combination"})
			continue
		}
		for _, c := range combos {
			js := v1alpha1.JobStatus{Name: c.Name(job.ID), Job: job.ID, Matrix: c.Status(), Phase: v1alpha1.JobPending}
			if len(js.Name) > maxInstanceName {
				return nil, fmt.Errorf("job %s: an instance's name (%s) is %d bytes, at most %d allowed", job.ID, bounds.Truncate(js.Name, bounds.Quoted), len(js.Name), maxInstanceName)
			}
			js.Steps = pendingSteps(job)
			out = append(out, js)
		}
	}
	return out, nil
}

func pendingSteps(job *v1alpha1.Job) []v1alpha1.StepStatus {
	steps := make([]v1alpha1.StepStatus, len(job.Steps))
	for i, s := range job.Steps {
		steps[i] = v1alpha1.StepStatus{Name: stepName(s, i), ID: s.ID, Phase: v1alpha1.JobPending}
	}
	return steps
}

// stepName is a step's display name: its name, else GitHub's "Run <first
// line>" or the action it uses.
func stepName(s v1alpha1.Step, i int) string {
	switch {
	case s.Name != "":
		return s.Name
	case s.Uses != "":
		return s.Uses
	case s.Run != "":
		line, _, _ := strings.Cut(strings.TrimSpace(s.Run), "\n")
		return bounds.Truncate("Run "+line, bounds.WorkflowName)
	}
	return fmt.Sprintf("step %d", i+1)
}

// needResult is GitHub's needs.<id>.result of a job over its instances:
// "" while any is not done; failure if any failed, cancelled if any was
// cancelled, skipped if all were, success otherwise.
func needResult(st *v1alpha1.WorkflowRunStatus, id string) string {
	n, skipped := 0, 0
	res := resultSuccess
	for _, js := range st.Jobs {
		if js.Job != id {
			continue
		}
		n++
		switch js.Phase {
		case v1alpha1.JobSucceeded:
		case v1alpha1.JobSkipped:
			skipped++
		case v1alpha1.JobFailed:
			res = resultFailure
		case v1alpha1.JobCancelled:
			if res != resultFailure {
				res = resultCancelled
			}
		default:
			return ""
		}
	}
	if n > 0 && skipped == n {
		return resultSkipped
	}
	return res
}

// needOutputs merges a job's instances' outputs, later instances winning
// (GitHub leaves a matrix job's outputs to whichever instance set them
// last).
func needOutputs(st *v1alpha1.WorkflowRunStatus, id string) map[string]string {
	out := map[string]string{}
	for _, js := range st.Jobs {
		if js.Job == id {
			for _, o := range js.Outputs {
				out[o.Name] = o.Value
			}
		}
	}
	return out
}

// ancestors returns the jobs id needs, directly or not.
func ancestors(spec *v1alpha1.WorkflowSpec, id string) []string {
	byID := map[string]*v1alpha1.Job{}
	for i := range spec.Jobs {
		byID[spec.Jobs[i].ID] = &spec.Jobs[i]
	}
	seen := map[string]bool{}
	var walk func(string)
	walk = func(j string) {
		if job := byID[j]; job != nil {
			for _, n := range job.Needs {
				if !seen[n] {
					seen[n] = true
					walk(n)
				}
			}
		}
	}
	walk(id)
	return slices.Sorted(maps.Keys(seen))
}

// jobDecider decides one job instance.
type jobDecider struct {
	w     *world
	p     *plan
	job   *v1alpha1.Job
	js    *v1alpha1.JobStatus
	index int // among the job's instances
	// scope is the Workflow the job is in (the run's own: flat.top).
	scope *callScope
	// mat is the instance's matrix context, once made (matrix).
	mat *wfexpr.Object
	// needs and needStatus are baseContext's needs context and job
	// status, once made: a decider lives for one visit of its instance,
	// which comes after its needs' (flat.order), so they do not change.
	needs      map[string]wfexpr.JobResult
	needStatus string
}

func (d *jobDecider) decide() {
	if d.scope.caller != "" && !d.callerStarted() {
		return
	}
	switch d.js.Phase {
	case v1alpha1.JobPending, "":
		d.pending()
	case v1alpha1.JobRunning:
		if d.job.Uses == "" { // a calling job ends in finishCall
			d.running()
		}
	}
}

// baseContext is the expression context every expression of the job
// sees: workflow (and github), env (workflow and job), inputs, matrix and
// needs; Status is what a job-level if: reads: success when every need
// succeeded, failure when any job it needs (directly or not) failed,
// skipped (neither success() nor failure()) otherwise.
func (d *jobDecider) baseContext() *wfexpr.Context {
	w := d.w
	if d.needs == nil {
		st := &d.p.status
		d.needs, d.needStatus = map[string]wfexpr.JobResult{}, resultSuccess
		for _, n := range d.job.Needs {
			r := needResult(st, n)
			d.needs[d.scope.local(n)] = wfexpr.JobResult{Result: r, Outputs: needOutputs(st, n)}
			if r != resultSuccess {
				d.needStatus = resultSkipped
			}
		}
		for _, a := range w.layout.ancestors[d.job.ID] {
			if needResult(st, a) == resultFailure {
				d.needStatus = resultFailure
			}
		}
	}
	env := map[string]string{}
	for _, e := range d.scope.spec.Env {
		env[e.Name] = e.Value
	}
	for _, e := range d.job.Env {
		env[e.Name] = e.Value
	}
	return &wfexpr.Context{
		Workflow:  wfexpr.WorkflowInfo{Name: w.wf.Name, RunID: string(w.wf.UID), Attempt: int(max(d.js.Attempt, 1))},
		Env:       env,
		Inputs:    d.w.scopeInputs(d.p, d.scope).values,
		Matrix:    d.matrix(),
		Needs:     d.needs,
		Status:    d.needStatus,
		Cancelled: w.wf.Spec.CancelRequested,
	}
}

// matrix is the instance's combination as the matrix context.
// Made once per decider: every expression context of the instance has
// it, and the combination never changes.
func (d *jobDecider) matrix() *wfexpr.Object {
	if d.mat != nil {
		return d.mat
	}
	o, err := wfexpr.MatrixFromStatus(d.js.Matrix)
	if err != nil {
		o = wfexpr.NewObject() // written by this controller: cannot happen
	}
	d.mat = o
	return o
}

func (d *jobDecider) pending() {
	w, js := d.w, d.js
	if w.wf.Spec.CancelRequested {
		d.end(v1alpha1.JobSkipped, "the WorkflowRun was cancelled before the job started")
		return
	}
	for _, n := range d.job.Needs {
		if needResult(&d.p.status, n) == "" {
			return // a need is not done
		}
	}
	if d.failFastHit() {
		d.end(v1alpha1.JobCancelled, "another instance of the job failed (strategy.failFast)")
		return
	}
	if t := w.notBefore(js.Name); js.Attempt > 1 && w.now.Before(t) {
		d.p.retryAt[js.Name] = t
		d.p.wakeAt(t)
		return
	}
	if js.Attempt <= 1 {
		// The if is decided once; a retried attempt runs anyway.
		ok, err := wfexpr.EvalIf(d.job.If, d.baseContext())
		if err != nil {
			d.end(v1alpha1.JobFailed, fmt.Sprintf("if: %v", err))
			return
		}
		if !ok {
			d.end(v1alpha1.JobSkipped, "")
			return
		}
	}
	if d.job.Uses != "" {
		d.startCall()
		return
	}
	if mp := d.maxParallel(); mp > 0 && d.runningInstances() >= mp {
		return
	}
	js.Phase = v1alpha1.JobRunning
	js.Attempt = max(js.Attempt, 1)
	t := metav1.NewTime(w.now)
	js.StartTime, js.CompletionTime = &t, nil
	js.Message = ""
	d.running()
}

func (d *jobDecider) maxParallel() int {
	if d.job.Strategy == nil {
		return 0
	}
	return int(d.job.Strategy.MaxParallel)
}

func (d *jobDecider) runningInstances() int {
	n := 0
	for _, js := range d.p.status.Jobs {
		if js.Job == d.job.ID && js.Phase == v1alpha1.JobRunning {
			n++
		}
	}
	return n
}

// failFastHit reports whether another instance of a matrix job failed
// while strategy.failFast (default true) holds.
func (d *jobDecider) failFastHit() bool {
	s := d.job.Strategy
	if s == nil || s.Matrix == nil || (s.FailFast != nil && !*s.FailFast) {
		return false
	}
	n := d.w.failed[d.job.ID]
	if d.js.Phase == v1alpha1.JobFailed {
		n-- // another instance
	}
	return n > 0
}

// end makes the instance terminal; steps not started are Skipped.
func (d *jobDecider) end(phase v1alpha1.JobPhase, msg string) {
	js := d.js
	if phase == v1alpha1.JobFailed && js.Phase != v1alpha1.JobFailed && d.w.failed != nil {
		d.w.failed[js.Job]++
	}
	js.Phase = phase
	js.Message = bounds.Truncate(msg, bounds.WorkflowJobMessage)
	t := metav1.NewTime(d.w.now)
	js.CompletionTime = &t
	for i := range js.Steps {
		// A step that was running ended with its Run (Cancelled when the
		// job was); one that had not started never will.
		if s := &js.Steps[i]; !s.Phase.Terminal() {
			s.Phase, s.Outcome, s.Conclusion = v1alpha1.JobSkipped, resultSkipped, resultSkipped
		}
	}
}

// stopReason says why a running instance must stop now, if it must: the
// WorkflowRun was cancelled, the job ran out of time, or (fail-fast)
// another instance failed. The phase is the one the instance ends in.
func (d *jobDecider) stopReason() (v1alpha1.JobPhase, string, bool) {
	w, js := d.w, d.js
	if w.wf.Spec.CancelRequested {
		return v1alpha1.JobCancelled, "the WorkflowRun was cancelled", true
	}
	if d.failFastHit() {
		return v1alpha1.JobCancelled, "another instance of the job failed (strategy.failFast)", true
	}
	limit := defaultJobTimeout
	if d.job.TimeoutMinutes > 0 {
		limit = time.Duration(d.job.TimeoutMinutes) * time.Minute
	}
	if js.StartTime != nil {
		deadline := js.StartTime.Add(limit)
		if !w.now.Before(deadline) {
			return v1alpha1.JobFailed, fmt.Sprintf("the job ran longer than its %s timeout", limit), true
		}
		d.p.wakeAt(deadline)
	}
	return "", "", false
}

// running advances a running instance: it looks at its steps in order,
// records those that ended, and starts the next one.
func (d *jobDecider) running() {
	js := d.js
	stopPhase, stopMsg, stopping := d.stopReason()
	sc := newStepScope(d)
	for i := range d.job.Steps {
		step := &d.job.Steps[i]
		ss := &js.Steps[i]
		if ss.Phase.Terminal() {
			sc.record(i, step, ss)
			continue
		}
		if ss.Phase == v1alpha1.JobRunning || ss.Run != "" {
			if !d.observe(i, step, ss, sc) {
				// Still running.
				if stopping {
					if ss.Run != "" {
						d.p.cancel = append(d.p.cancel, ss.Run)
					}
				}
				return
			}
			if ss.Phase.Terminal() {
				sc.record(i, step, ss)
				if sc.infra != "" {
					d.attemptFailed(sc)
					return
				}
				continue
			}
		}
		if stopping {
			if name, active := d.hashActive(i, sc); active {
				d.p.cancel = append(d.p.cancel, name)
				return
			}
			d.end(stopPhase, stopMsg)
			d.cleanup(sc)
			return
		}
		// Pending: hash what its hashFiles() calls name, decide its if,
		// then start it.
		if d.hashFiles(i, step, ss, sc) {
			return
		}
		if sc.infra != "" {
			d.attemptFailed(sc)
			return
		}
		if ss.Phase.Terminal() {
			sc.record(i, step, ss)
			continue
		}
		ok, err := wfexpr.EvalIf(step.If, sc.context())
		if err != nil {
			d.stepEnded(ss, v1alpha1.JobFailed, resultFailure, nil, fmt.Sprintf("if: %v", err))
			sc.record(i, step, ss)
			continue
		}
		if !ok {
			ss.Phase, ss.Outcome, ss.Conclusion = v1alpha1.JobSkipped, resultSkipped, resultSkipped
			sc.record(i, step, ss)
			continue
		}
		started := d.start(i, step, ss, sc)
		sc.hashes = nil
		if !started {
			return
		}
		if ss.Phase.Terminal() {
			sc.record(i, step, ss)
			continue
		}
		return // wait for it
	}
	if stopping {
		d.end(stopPhase, stopMsg)
		d.cleanup(sc)
		return
	}
	// Every step is done.
	d.cleanup(sc)
	js.Outputs = d.outputs(sc)
	if sc.failed {
		d.attemptFailed(sc)
		return
	}
	d.end(v1alpha1.JobSucceeded, "")
}

// attemptFailed ends the instance's attempt: the retry engine decides
// from the job's retry policy whether it runs again whole.
func (d *jobDecider) attemptFailed(sc *stepScope) {
	js := d.js
	reason := retry.Reason(cmpOr(sc.infra, sc.reason))
	msg := sc.message
	// The engine decides over a Run; the job's attempt is one.
	probe := &v1alpha1.Run{Spec: v1alpha1.RunSpec{RetryPolicy: d.job.RetryPolicy}, Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseRunning, Attempt: max(js.Attempt, 1)}}
	dec := retry.Decide(probe, reason, msg, d.w.now)
	if sc.infra != "" {
		d.cleanup(sc)
	}
	if !dec.Retry {
		d.end(v1alpha1.JobFailed, dec.Message)
		return
	}
	js.Phase = v1alpha1.JobPending
	js.Attempt = dec.NextAttempt
	js.Message = bounds.Truncate(dec.Message, bounds.WorkflowJobMessage)
	js.Pod, js.PodUID = "", ""
	js.StartTime, js.CompletionTime = nil, nil
	js.Outputs = nil
	js.Steps = pendingSteps(d.job)
	d.p.retryAt[js.Name] = dec.NotBefore
	d.p.wakeAt(dec.NotBefore)
}

// stepEnded records a step's end.
func (d *jobDecider) stepEnded(ss *v1alpha1.StepStatus, phase v1alpha1.JobPhase, outcome string, exit *int32, msg string) {
	ss.Phase, ss.Outcome, ss.Conclusion = phase, outcome, outcome
	ss.ExitCode = exit
	ss.Message = bounds.Truncate(msg, bounds.WorkflowStepMessage)
	t := metav1.NewTime(d.w.now)
	if ss.StartTime == nil {
		ss.StartTime = &t
	}
	ss.CompletionTime = &t
}

// outputs evaluates the job's outputs over its steps.
func (d *jobDecider) outputs(sc *stepScope) []v1alpha1.NameValue {
	var out []v1alpha1.NameValue
	for _, o := range d.job.Outputs {
		v, err := wfexpr.EvalString(o.Value, sc.context())
		if err != nil {
			v = ""
		}
		out = append(out, v1alpha1.NameValue{Name: o.Name, Value: v})
	}
	return out
}

// scopeOutputs evaluates a Workflow's outputs (the run's own, or a
// called one's) over its jobs' outputs.
func scopeOutputs(w *world, st *v1alpha1.WorkflowRunStatus, s *callScope) []v1alpha1.NameValue {
	if len(s.spec.Outputs) == 0 {
		return nil
	}
	jobs := map[string]wfexpr.JobResult{}
	for _, id := range s.jobs {
		jobs[s.local(id)] = wfexpr.JobResult{Result: needResult(st, id), Outputs: needOutputs(st, id)}
	}
	c := &wfexpr.Context{Jobs: jobs, Inputs: w.scopeInputs(nil, s).values, Workflow: wfexpr.WorkflowInfo{Name: w.wf.Name, RunID: string(w.wf.UID), Attempt: 1}}
	var out []v1alpha1.NameValue
	for _, o := range s.spec.Outputs {
		v, err := wfexpr.EvalString(o.Value, c)
		if err != nil {
			v = ""
		}
		out = append(out, v1alpha1.NameValue{Name: o.Name, Value: v})
	}
	return out
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
