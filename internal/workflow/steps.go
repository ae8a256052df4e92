package workflow

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/validation"
	"stoke.dev/stoke/internal/wfexpr"
)

// stepCleanup is the step index, in a Run's name, of the job's cleanup
// Run, which removes the workspace when its last step did not.
const stepCleanup = -1

// infraReasons are a step Run's failures that are the pool's, not the
// step's: the job's attempt failed, and its retry policy decides whether
// it runs again whole (its workspace was on a pod that may be gone).
var infraReasons = []retry.Reason{retry.PodGone, retry.ExecutionLost, retry.RuntimeExecute, retry.BackendSetupFailed}

// stepScope is what the steps of one attempt have produced so far, for
// the next steps' expressions, env and placement.
type stepScope struct {
	d      *jobDecider
	steps  map[string]wfexpr.StepResult
	env    []v1alpha1.EnvVar
	failed bool
	// reason and message of the first failure; infra is set when the
	// failure is the pool's (retry.Reason).
	reason, message, infra string
	// pod and podUID: where the attempt's Runs run, once the first is
	// placed; created counts the Runs of the attempt; released is set
	// once a Run that removes the workspace was made.
	pod, podUID string
	created     int
	released    bool
	// hashes answers the hashFiles() calls of the step being decided, by
	// their patterns (set by hashFiles; nil: none are answered).
	hashes map[string]string
}

func newStepScope(d *jobDecider) *stepScope {
	sc := &stepScope{d: d, steps: map[string]wfexpr.StepResult{}}
	if d.js.PodUID != "" {
		sc.pod, sc.podUID = d.js.Pod, d.js.PodUID
	}
	return sc
}

func (sc *stepScope) place(run *v1alpha1.Run) {
	if sc.podUID == "" && run.Status.AssignedPodUID != "" {
		sc.pod, sc.podUID = run.Status.AssignedPod, run.Status.AssignedPodUID
		sc.d.js.Pod, sc.d.js.PodUID = sc.pod, sc.podUID
	}
}

// record takes in a step that ended.
func (sc *stepScope) record(i int, step *v1alpha1.Step, ss *v1alpha1.StepStatus) {
	if ss.Run != "" {
		sc.created++
		if i == len(sc.d.job.Steps)-1 {
			sc.released = true
		}
	}
	outs := map[string]string{}
	if ss.Run != "" {
		// A step's outputs and env stay in its Run's status (the
		// WorkflowRun's would outgrow etcd's bound).
		if run, ok := sc.d.w.run(ss.Run); ok {
			sc.place(run)
			if run.Status.Phase == v1alpha1.PhaseSucceeded {
				sc.env = mergeEnv(sc.env, run.Status.Env)
			}
			for k, v := range run.Status.Outputs {
				outs[k] = v
			}
		}
	}
	if step.ID != "" {
		sc.steps[step.ID] = wfexpr.StepResult{Outputs: outs, Outcome: ss.Outcome, Conclusion: ss.Conclusion}
	}
	if ss.Conclusion == resultFailure || ss.Conclusion == resultCancelled {
		if !sc.failed {
			sc.reason = cmpOr(sc.reason, string(retry.NonZeroExit))
			sc.message = fmt.Sprintf("step %s: %s", ss.Name, cmpOr(ss.Message, ss.Outcome))
		}
		sc.failed = true
	}
}

// context is the expression context of a step: the job's, with steps,
// the env as the step sees it, and job.status (what success() and
// failure() read) from the steps so far.
func (sc *stepScope) context() *wfexpr.Context {
	c := sc.d.baseContext()
	c.Steps = sc.steps
	c.Status = resultSuccess
	if sc.failed {
		c.Status = resultFailure
	}
	for _, e := range sc.env {
		c.Env[e.Name] = e.Value
	}
	if h := sc.hashes; h != nil {
		c.HashFiles = func(patterns string) (string, error) {
			v, ok := h[patterns]
			if !ok {
				return "", fmt.Errorf("hashFiles(%s) was not hashed before the step", bounds.Quote(patterns))
			}
			return v, nil
		}
	}
	return c
}

func mergeEnv(env []v1alpha1.EnvVar, more []v1alpha1.EnvVar) []v1alpha1.EnvVar {
	for _, e := range more {
		if i := slices.IndexFunc(env, func(x v1alpha1.EnvVar) bool { return x.Name == e.Name }); i >= 0 {
			env[i].Value = e.Value
		} else {
			env = append(env, e)
		}
	}
	return env
}

func (d *jobDecider) runName(step int) string {
	return stepRunName(d.w.wf.Name, string(d.w.wf.UID), d.job.ID, d.index, max(d.js.Attempt, 1), step)
}

func (d *jobDecider) workspace() string {
	return workspaceName(string(d.w.wf.UID), d.job.ID, d.index, max(d.js.Attempt, 1))
}

func isArtifactStep(s *v1alpha1.Step) bool { return s.Uses == usesUpload || s.Uses == usesDownload }

// observe looks at a started step. It reports whether the step has ended
// (or was never made: it then ends Failed).
func (d *jobDecider) observe(i int, step *v1alpha1.Step, ss *v1alpha1.StepStatus, sc *stepScope) bool {
	w := d.w
	run, ok := w.run(ss.Run)
	if !ok {
		return false // created; the informer has not shown it yet
	}
	sc.place(run)
	// An artifact step's Run holds the workspace while the controller
	// copies through it, then ends as the copy did.
	copied, copyDone := w.artifact(ss.Run)
	if !run.Status.Phase.Terminal() {
		if run.Status.Phase == v1alpha1.PhaseRunning && ss.Phase != v1alpha1.JobRunning {
			ss.Phase = v1alpha1.JobRunning
			t := metav1.NewTime(w.now)
			ss.StartTime = &t
		}
		if isArtifactStep(step) && run.Status.Phase == v1alpha1.PhaseRunning && !copyDone && !run.Spec.CancelRequested {
			// Not copied, and perhaps not in flight (a restart): the
			// controller starts it unless it is in flight.
			d.p.artifacts = append(d.p.artifacts, d.artifactOp(i, step, sc, run))
		}
		return false
	}
	if isArtifactStep(step) && !copyDone && w.copying(ss.Run) {
		// The copy released the hold, which ended, and its result is on
		// its way back (result): that, not the hold's exit status, says
		// what became of the step.
		return false
	}
	ss.ExitCode = run.Status.ExitCode
	msg := run.Status.Message
	if isArtifactStep(step) && copyDone {
		msg = copied.message
		if copied.err != nil {
			msg = copied.err.Error()
		}
	}
	switch run.Status.Phase {
	case v1alpha1.PhaseSucceeded:
		d.stepEnded(ss, v1alpha1.JobSucceeded, resultSuccess, run.Status.ExitCode, msg)
		return true
	case v1alpha1.PhaseCancelled:
		if !isArtifactStep(step) || !copyDone || copied.err == nil {
			d.stepEnded(ss, v1alpha1.JobCancelled, resultCancelled, run.Status.ExitCode, msg)
			return true
		}
		// Ended by the controller because its copy could not start.
	}
	reason := retry.Reason(run.Status.Reason)
	pinned := run.Spec.Placement != nil && run.Spec.Placement.PodUID != ""
	if reason == retry.Unschedulable && pinned {
		// The job's pod went away between two steps.
		reason = retry.PodGone
	}
	d.stepEnded(ss, v1alpha1.JobFailed, resultFailure, run.Status.ExitCode, cmpOr(msg, string(run.Status.Phase)))
	if slices.Contains(infraReasons, reason) {
		sc.infra = string(reason)
		sc.message = fmt.Sprintf("step %s: %s", ss.Name, bounds.Truncate(msg, 1024))
		return true
	}
	if run.Status.Phase == v1alpha1.PhaseTimeout {
		sc.reason = string(retry.Timeout)
	}
	if step.ContinueOnError {
		ss.Conclusion = resultSuccess
	}
	return true
}

// start starts a step whose if held: it makes its Run. It reports false
// when the step must wait.
func (d *jobDecider) start(i int, step *v1alpha1.Step, ss *v1alpha1.StepStatus, sc *stepScope) bool {
	w := d.w
	now := metav1.NewTime(w.now)
	run, err := d.stepRun(i, step, sc, i == len(d.job.Steps)-1)
	if err != nil {
		d.stepEnded(ss, v1alpha1.JobFailed, resultFailure, nil, err.Error())
		if step.ContinueOnError {
			ss.Conclusion = resultSuccess
		}
		return true
	}
	d.p.create = append(d.p.create, run)
	ss.Run = run.Name
	ss.Phase, ss.StartTime = v1alpha1.JobPending, &now
	sc.created++
	return true
}

// cleanup makes the Run that removes the attempt's workspace when no step
// Run did (the last step was skipped, or the job stopped early), on the
// job's pod.
func (d *jobDecider) cleanup(sc *stepScope) {
	if sc.released || sc.created == 0 || sc.podUID == "" || sc.infra != "" {
		return
	}
	run, err := d.stepRun(stepCleanup, nil, sc, true)
	if err != nil {
		return
	}
	d.p.create = append(d.p.create, run)
	sc.released = true
}

// artifactOp is the copy of an artifact step, through its Run.
func (d *jobDecider) artifactOp(i int, step *v1alpha1.Step, sc *stepScope, run *v1alpha1.Run) artifactOp {
	with := map[string]string{}
	var err error
	// Its with: is evaluated now, with the answers of its hash Run.
	d.hashFiles(i, step, &v1alpha1.StepStatus{}, sc)
	defer func() { sc.hashes = nil }()
	for _, nv := range step.With {
		if with[nv.Name], err = wfexpr.EvalString(nv.Value, sc.context()); err != nil {
			break
		}
	}
	return artifactOp{ArtifactCopy: ArtifactCopy{Upload: step.Uses == usesUpload, With: with, Namespace: d.w.wf.Namespace,
		WorkflowRun: d.w.wf.Name, WorkflowRunUID: string(d.w.wf.UID), Run: run.Name, RunUID: string(run.UID)}, err: err}
}

func (d *jobDecider) runtime() string {
	return cmpOr(d.job.RunsOn, DefaultRuntime)
}

// DefaultRuntime is the Runtime of a job that names none.
const DefaultRuntime = "bash"

// stepRun builds the Run of step i (or of the setup or cleanup Run, step
// nil): a task on the job's Runtime, pinned to the job's pod once it has
// one, in the job's workspace.
func (d *jobDecider) stepRun(i int, step *v1alpha1.Step, sc *stepScope, last bool) (*v1alpha1.Run, error) {
	w := d.w
	rt := d.runtime()
	server := w.server(rt)
	name := d.runName(i)
	run := &v1alpha1.Run{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.wf.Namespace,
			Labels: map[string]string{LabelWorkflowRun: w.wf.Name, LabelJob: labelValue(d.job.ID), LabelStep: strconv.Itoa(i)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindWorkflowRun,
				Name: w.wf.Name, UID: w.wf.UID, Controller: ptr(true)}}},
		Spec: v1alpha1.RunSpec{Runtime: rt,
			Placement: &v1alpha1.Placement{PodUID: sc.podUID, Workspace: d.workspace(), ReleaseWorkspace: last}},
	}
	if i < 0 {
		run.Labels[LabelStep] = "cleanup"
		run.Spec.Mode.Task = noop(server)
		return run, nil
	}
	ctx := sc.context()
	env := map[string]string{}
	var order []string
	put := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	render := func(what string, vars []v1alpha1.EnvVar) error {
		for _, e := range vars {
			v, err := wfexpr.EvalString(e.Value, ctx)
			if err != nil {
				return fmt.Errorf("%s env %s: %w", what, e.Name, err)
			}
			put(e.Name, v)
		}
		return nil
	}
	put("CI", "true")
	put("STOKE_WORKFLOW_RUN", w.wf.Name)
	put("STOKE_JOB", d.js.Name)
	if err := render("workflow", d.scope.spec.Env); err != nil {
		return nil, err
	}
	if err := render("job", d.job.Env); err != nil {
		return nil, err
	}
	for _, e := range sc.env {
		put(e.Name, e.Value)
	}
	if err := render("step", step.Env); err != nil {
		return nil, err
	}
	if step.TimeoutMinutes > 0 {
		run.Spec.Timeout = &metav1.Duration{Duration: time.Duration(step.TimeoutMinutes) * time.Minute}
	}
	switch {
	case isArtifactStep(step):
		if server == "python" {
			return nil, fmt.Errorf("uses: %s needs a bash Runtime; this job's Runtime runs python only", step.Uses)
		}
		run.Spec.Mode.Task = &v1alpha1.TaskMode{Args: artifact.HoldCommand()}
		// The copy starts once it is Running: not 100 ms later, as a
		// Kubernetes runtimed would otherwise write it.
		run.Annotations = map[string]string{v1alpha1.AnnotationClaimFirst: "true"}
	case step.Uses == usesCheckout:
		if w.wf.Spec.Source == nil {
			return nil, fmt.Errorf("uses: checkout, but the WorkflowRun has no spec.source")
		}
		g := *w.wf.Spec.Source
		for _, nv := range step.With {
			v, err := wfexpr.EvalString(nv.Value, ctx)
			if err != nil {
				return nil, fmt.Errorf("with.%s: %w", nv.Name, err)
			}
			switch nv.Name {
			case "ref":
				g.Ref, g.Commit = v, ""
			case "path":
				g.Path = v
			}
		}
		run.Spec.Source = &v1alpha1.Source{Git: &g}
		run.Spec.Mode.Task = noop(server)
	default:
		shell := cmpOr(step.Shell, "bash")
		script, exprs, err := rewriteScript(step.Run, shell)
		if err != nil {
			return nil, err
		}
		for n, e := range exprs {
			v, err := e.Eval(ctx)
			if err != nil {
				return nil, fmt.Errorf("run: %w", err)
			}
			put(fmt.Sprintf("%s%d", exprEnvPrefix, n), wfexpr.ToString(v))
		}
		file := path.Join(".stoke", fmt.Sprintf("step-%d", i))
		run.Spec.Source = &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: file, Text: script}}
		workdir, err := workingDirectory(step.WorkingDirectory, ctx)
		if err != nil {
			return nil, err
		}
		task, err := shellTask(server, shell, file, workdir)
		if err != nil {
			return nil, err
		}
		run.Spec.Mode.Task = task
	}
	if len(order) > bounds.EnvEntries {
		return nil, fmt.Errorf("the step has %d environment variables, at most %d allowed", len(order), bounds.EnvEntries)
	}
	for _, k := range order {
		run.Spec.Env = append(run.Spec.Env, v1alpha1.EnvVar{Name: k, Value: env[k]})
	}
	return run, nil
}

// noop is a task that does nothing, on the Runtime's server: a checkout's
// Run (its source is the work), a setup or cleanup Run.
func noop(server string) *v1alpha1.TaskMode {
	if server == "python" {
		return &v1alpha1.TaskMode{Args: []string{"-c", "pass"}}
	}
	return &v1alpha1.TaskMode{Args: []string{"true"}}
}

// workingDirectory is a step's working-directory with its expressions
// evaluated, checked as validation checks one written without them:
// relative, no '..' (the workspace itself is "").
func workingDirectory(wd string, ctx *wfexpr.Context) (string, error) {
	if !wfexpr.HasExpressions(wd) {
		return wd, nil
	}
	v, err := wfexpr.EvalString(wd, ctx)
	if err != nil {
		return "", fmt.Errorf("working-directory: %w", err)
	}
	clean := strings.TrimSuffix(strings.TrimSuffix(v, "/."), "/")
	if clean == "" || clean == "." {
		return "", nil
	}
	if err := validation.RelativePath("working-directory", clean); err != nil {
		return "", fmt.Errorf("working-directory %s: %w", bounds.Quote(wd), err)
	}
	return v, nil
}

// shellTask runs a step's script file with its shell as GitHub Actions
// does (bash: --noprofile --norc -eo pipefail; sh: -e), from its
// working directory. A python Runtime runs only python steps: its server
// puts its interpreter before any command.
func shellTask(server, shell, file, workdir string) (*v1alpha1.TaskMode, error) {
	if server == "python" {
		if shell != "python" || workdir != "" {
			return nil, fmt.Errorf("a step with shell %s (or a working-directory) needs a bash Runtime; this job's Runtime runs python only", shell)
		}
		return &v1alpha1.TaskMode{Entrypoint: file}, nil
	}
	var argv []string
	switch shell {
	case "bash":
		argv = []string{"bash", "--noprofile", "--norc", "-eo", "pipefail"}
	case "sh":
		argv = []string{"sh", "-e"}
	case "python":
		argv = []string{"python3"}
	default:
		return nil, fmt.Errorf("shell %q is not one of bash, sh, python", shell)
	}
	if workdir == "" {
		return &v1alpha1.TaskMode{Args: append(argv, file)}, nil
	}
	// cd first; the directory and the script's path are arguments of a
	// constant script, never source.
	const cd = `dir=$1 file=$2; shift 2; cd -- "$dir" || exit 1; exec "$@" "$OLDPWD/$file"`
	return &v1alpha1.TaskMode{Args: append([]string{"bash", "-c", cd, "stoke-step", workdir, file}, argv...)}, nil
}

// inputsContext is the inputs context: the WorkflowRun's inputs over the
// called Workflow's defaults, typed as its inputs declare.
func inputsContext(w *world) map[string]any {
	out := map[string]any{}
	given := map[string]string{}
	for _, nv := range w.wf.Spec.Inputs {
		given[nv.Name] = nv.Value
	}
	for _, in := range w.spec.Inputs {
		v, ok := given[in.Name]
		if !ok {
			v = in.Default
		}
		out[in.Name] = typed(in.Type, v)
		delete(given, in.Name)
	}
	for k, v := range given {
		out[k] = v
	}
	return out
}

func typed(t, v string) any {
	switch t {
	case "number":
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	case "boolean":
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return v
}

func ptr[T any](v T) *T { return &v }
