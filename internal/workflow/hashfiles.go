package workflow

import (
	"fmt"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/hashfiles"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/wfexpr"
)

// hashCalls are the distinct pattern lists of the hashFiles() calls in a
// step's if, run, env, with and working-directory, in the order they are written, evaluated
// in c (every branch: one hash Run answers them all).
func hashCalls(step *v1alpha1.Step, c *wfexpr.Context) []string {
	var calls []string
	add := func(ps []string) {
		for _, p := range ps {
			if !slices.Contains(calls, p) {
				calls = append(calls, p)
			}
		}
	}
	if step.If != "" {
		if e, err := wfexpr.Parse(step.If); err == nil {
			add(e.HashFilesCalls(c))
		}
	}
	texts := []string{step.Run, step.WorkingDirectory}
	for _, e := range step.Env {
		texts = append(texts, e.Value)
	}
	for _, nv := range step.With {
		texts = append(texts, nv.Value)
	}
	for _, s := range texts {
		if !wfexpr.HasExpressions(s) {
			continue
		}
		if t, err := wfexpr.ParseTemplate(s); err == nil && t.CallsHashFiles() {
			add(t.HashFilesCalls(c))
		}
	}
	return calls
}

func (d *jobDecider) hashRunName(step int) string {
	return hashRunName(d.w.wf.Name, string(d.w.wf.UID), d.job.ID, d.index, max(d.js.Attempt, 1), step)
}

// hashFiles makes sure the files step i's hashFiles() calls name are
// hashed before the step is decided: by a hash Run on the job's pod, in
// its workspace (`stoke hash-files`, writing h<n> to $GITHUB_OUTPUT),
// named from the step so that a restarted controller finds it. It sets
// sc.hashes to the answers, and reports wait while the Run has not
// ended; a Run that failed fails the step (its message says why) or,
// when the pool lost it, the attempt (sc.infra).
func (d *jobDecider) hashFiles(i int, step *v1alpha1.Step, ss *v1alpha1.StepStatus, sc *stepScope) (wait bool) {
	sc.hashes = nil
	calls := hashCalls(step, sc.context())
	if len(calls) == 0 {
		return false
	}
	fail := func(msg string) bool {
		d.stepEnded(ss, v1alpha1.JobFailed, resultFailure, nil, "hashFiles: "+msg)
		if step.ContinueOnError {
			ss.Conclusion = resultSuccess
		}
		return false
	}
	if len(calls) > bounds.HashFilesCalls {
		return fail(fmt.Sprintf("the step makes %d distinct calls, at most %d allowed", len(calls), bounds.HashFilesCalls))
	}
	if server := d.w.server(d.runtime()); server != "" && server != "bash" {
		return fail(fmt.Sprintf("it needs a bash Runtime; this job's Runtime runs %s", server))
	}
	name := d.hashRunName(i)
	run, ok := d.w.run(name)
	if !ok {
		d.p.create = append(d.p.create, d.hashRun(i, name, calls, sc))
		sc.created++
		return true
	}
	sc.created++
	sc.place(run)
	if !run.Status.Phase.Terminal() {
		return true
	}
	if run.Status.Phase != v1alpha1.PhaseSucceeded {
		if reason := retry.Reason(run.Status.Reason); slices.Contains(infraReasons, reason) {
			sc.infra = string(reason)
			sc.message = fmt.Sprintf("step %s: hashFiles: %s", ss.Name, bounds.Truncate(run.Status.Message, 1024))
			return false
		}
		return fail(cmpOr(run.Status.Message, string(run.Status.Phase)))
	}
	sc.hashes = map[string]string{}
	for n, c := range calls {
		sc.hashes[c] = run.Status.Outputs[hashfiles.OutputName(n)]
	}
	return false
}

// hashActive reports whether step i has a hash Run still running (and
// counts it as the attempt's, on its pod).
func (d *jobDecider) hashActive(i int, sc *stepScope) (string, bool) {
	name := d.hashRunName(i)
	run, ok := d.w.run(name)
	if !ok {
		return "", false
	}
	sc.created++
	sc.place(run)
	return name, !run.Status.Phase.Terminal()
}

// hashRun is the Run that hashes calls in the job's workspace: Stoke's
// own program (hashfiles.Command), the patterns as arguments, never shell source.
func (d *jobDecider) hashRun(i int, name string, calls []string, sc *stepScope) *v1alpha1.Run {
	w := d.w
	return &v1alpha1.Run{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.wf.Namespace,
			Labels: map[string]string{LabelWorkflowRun: w.wf.Name, LabelJob: labelValue(d.job.ID), LabelStep: strconv.Itoa(i) + "-hash"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindWorkflowRun,
				Name: w.wf.Name, UID: w.wf.UID, Controller: ptr(true)}}},
		Spec: v1alpha1.RunSpec{Runtime: d.runtime(),
			Placement: &v1alpha1.Placement{PodUID: sc.podUID, Workspace: d.workspace()},
			Timeout:   &metav1.Duration{Duration: bounds.HashFilesTimeout},
			Mode:      v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: hashfiles.Command(calls)}},
		},
	}
}
