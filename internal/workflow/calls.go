package workflow

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// scopeInputs is scope s's inputs context: the run's inputs for the top
// scope; for a called Workflow, the calling job's with: evaluated in the
// calling job's context (its needs' results are fixed once it starts, so
// evaluating again gives the same), kept for the rest of the decision.
// p is the decision's plan (nil: outside one, as for outputs).
func (w *world) scopeInputs(p *plan, s *callScope) scopeInputs {
	if s.caller == "" {
		return scopeInputs{values: inputsContext(w)}
	}
	if in, ok := w.inputs[s]; ok {
		return in
	}
	var in scopeInputs
	caller := w.callerStatus(p, s)
	job := w.job(s.caller)
	if caller == nil || job == nil {
		in.err = fmt.Errorf("no calling job %s", s.caller) // cannot happen: flatten made both
	} else {
		if p == nil {
			p = &plan{status: *w.wf.Status.DeepCopy()}
		}
		d := &jobDecider{w: w, p: p, job: job, js: caller, scope: s.parent}
		in.values, in.err = callInputs(s.workflow, s.spec.Inputs, job.With, d.baseContext())
	}
	if in.values == nil {
		in.values = map[string]any{}
	}
	w.inputs[s] = in
	return in
}

// callerStatus is the status of the job that opens scope s, from p's
// status (what this decision has written so far) or the run's.
func (w *world) callerStatus(p *plan, s *callScope) *v1alpha1.JobStatus {
	st := &w.wf.Status
	if p != nil {
		st = &p.status
	}
	for i := range st.Jobs {
		if st.Jobs[i].Job == s.caller {
			return &st.Jobs[i]
		}
	}
	return nil
}

func (w *world) job(id string) *v1alpha1.Job {
	for i := range w.spec.Jobs {
		if w.spec.Jobs[i].ID == id {
			return &w.spec.Jobs[i]
		}
	}
	return nil
}

// callerStarted reports whether the job that calls this job's Workflow
// has started, so that this job may. A calling job that ended without
// starting its scope (skipped, failed at its with:, cancelled) ends the
// scope's jobs that had not started Skipped.
func (d *jobDecider) callerStarted() bool {
	caller := d.w.callerStatus(d.p, d.scope)
	if caller == nil {
		return false
	}
	switch {
	case caller.Phase == v1alpha1.JobRunning:
		return true
	case caller.Phase.Terminal() && !d.js.Phase.Terminal() && d.js.Phase != v1alpha1.JobRunning:
		d.end(v1alpha1.JobSkipped, fmt.Sprintf("the calling job %s did not run", d.scope.caller))
	}
	return false
}

// startCall starts a job that calls a Workflow, its if: having held: its
// with: must give the called Workflow's inputs (typed, defaulted,
// required as declared), else it fails and its Workflow's jobs are
// skipped. It has no pod and no steps: its scope's jobs run.
func (d *jobDecider) startCall() {
	s := d.w.flat.calls[d.job.ID]
	if in := d.w.scopeInputs(d.p, s); in.err != nil {
		d.end(v1alpha1.JobFailed, fmt.Sprintf("calls Workflow %q: %v", d.job.Uses, in.err))
		return
	}
	js := d.js
	js.Phase, js.Attempt = v1alpha1.JobRunning, 1
	t := metav1.NewTime(d.w.now)
	js.StartTime, js.CompletionTime, js.Message = &t, nil, ""
}

// finishCall ends a running calling job once every job of the Workflow
// it calls has ended: its outputs are the Workflow's outputs over them;
// it fails when one of them failed (naming them), is cancelled when the
// run is or one was, and succeeds otherwise (all skipped too, as a job
// whose steps are all skipped does).
func (d *jobDecider) finishCall() {
	if d.js.Phase != v1alpha1.JobRunning {
		return
	}
	s := d.w.flat.calls[d.job.ID]
	st := &d.p.status
	res := resultSuccess
	for _, id := range s.jobs {
		switch needResult(st, id) {
		case "":
			return // one has not ended
		case resultFailure:
			res = resultFailure
		case resultCancelled:
			if res != resultFailure {
				res = resultCancelled
			}
		}
	}
	d.js.Outputs = scopeOutputs(d.w, st, s)
	switch {
	case res == resultFailure:
		var failed []string
		for _, js := range st.Jobs {
			if js.Phase == v1alpha1.JobFailed && d.w.flat.scopeOf[js.Job] == s {
				failed = append(failed, js.Name)
			}
		}
		d.end(v1alpha1.JobFailed, fmt.Sprintf("Workflow %q failed: %s", d.job.Uses, strings.Join(failed, ", ")))
	case d.w.wf.Spec.CancelRequested:
		d.end(v1alpha1.JobCancelled, "the WorkflowRun was cancelled")
	case res == resultCancelled:
		d.end(v1alpha1.JobCancelled, fmt.Sprintf("a job of Workflow %q was cancelled", d.job.Uses))
	default:
		d.end(v1alpha1.JobSucceeded, "")
	}
}
