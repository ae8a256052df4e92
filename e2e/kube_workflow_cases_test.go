package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// The "What must hold" for workflows on the test cluster, beside
// WorkflowPipeline (kube_workflow_test.go): a private repository checked
// out with the Runtime's Secret, cancel, bad input through the API
// server, and the controller leader killed mid-workflow.

// watchWorkflowRuns follows the WorkflowRuns of runsNamespace.
func (e *kubeEnv) watchWorkflowRuns(t testing.TB) *objects[*v1alpha1.WorkflowRun] {
	t.Helper()
	return follow(t, cache.NewListWatchFromClient(e.stoke, "workflowruns", runsNamespace, fields.Everything()), &v1alpha1.WorkflowRun{})
}

// createWorkflowRun creates the WorkflowRun manifest doc (YAML) in
// runsNamespace through the API server, as kubectl would: the CRD's
// schema and CEL rules decide there.
func (e *kubeEnv) createWorkflowRun(ctx context.Context, doc string) error {
	var wf v1alpha1.WorkflowRun
	if err := yaml.UnmarshalStrict([]byte(doc), &wf); err != nil {
		return fmt.Errorf("the test's manifest: %w", err)
	}
	wf.APIVersion, wf.Kind, wf.Namespace = v1alpha1.GroupVersion.String(), v1alpha1.KindWorkflowRun, runsNamespace
	return e.stoke.Post().Namespace(runsNamespace).Resource("workflowruns").Body(&wf).Do(ctx).Error()
}

func (e *kubeEnv) mustCreateWorkflowRun(t testing.TB, doc string) {
	t.Helper()
	if err := e.createWorkflowRun(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

// deleteWorkflowRuns deletes the named WorkflowRuns (their step Runs go
// with them), whatever their state.
func (e *kubeEnv) deleteWorkflowRuns(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		err := e.stoke.Delete().Namespace(runsNamespace).Resource("workflowruns").Name(n).Do(context.Background()).Error()
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete workflowrun %s: %v", n, err)
		}
	}
}

// awaitWorkflowEnd waits for the WorkflowRun name to end.
func awaitWorkflowEnd(t testing.TB, wfs *objects[*v1alpha1.WorkflowRun], name string) *v1alpha1.WorkflowRun {
	t.Helper()
	return wfs.until(t, 3*runBound, name+" ends", func(m map[string]*v1alpha1.WorkflowRun) bool {
		wf := m[name]
		return wf != nil && wf.Status.Phase.Terminal()
	})[name]
}

// workflowText is every message of wf's status: its own, its jobs' and
// their steps'.
func workflowText(wf *v1alpha1.WorkflowRun) string {
	msgs := []string{wf.Status.Reason + ": " + wf.Status.Message}
	for _, j := range wf.Status.Jobs {
		msgs = append(msgs, fmt.Sprintf("job %s %s: %s", j.Name, j.Phase, j.Message))
		for _, s := range j.Steps {
			msgs = append(msgs, fmt.Sprintf("step %s/%s %s: %s", j.Name, s.Name, s.Phase, s.Message))
		}
	}
	return strings.Join(msgs, "\n")
}

// gitRuntime is a bash Runtime of one Pod whose spec.git.credentialsSecret
// is gitSecret.
const (
	gitRuntime = "bash-git"
	gitSecret  = "git-creds"
)

// A private repository (the git-http-backend server requiring Basic
// authentication) on the cluster: a Runtime whose spec.git names a Secret
// of credentials checks it out for a WorkflowRun that names that Secret,
// and its step sees neither the Secret's file nor its mount; the same
// WorkflowRun without the name fails at the checkout step, saying where
// credentials come from, and one naming another Secret is refused
// (InvalidSpec) before anything is fetched.
func testWorkflowPrivateGit(t *testing.T, e *kubeEnv) {
	const password = "pw-kube-e2e-51c3"
	git := gittest.NewServer(t, gittest.Options{User: "ci", Password: password})
	commit, url := git.Commit(t, "private", map[string]string{"VERSION": "2.0\n"})
	ctx := context.Background()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: gitSecret, Namespace: runsNamespace},
		StringData: map[string]string{v1alpha1.GitCredentialsKey: strings.Replace(git.URL, "http://", "http://ci:"+password+"@", 1) + "\n"}}
	if _, err := e.kube.CoreV1().Secrets(runsNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.kube.CoreV1().Secrets(runsNamespace).Delete(ctx, gitSecret, metav1.DeleteOptions{}) })
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 4, Git: &v1alpha1.RuntimeGit{CredentialsSecret: gitSecret}}}
	rt.APIVersion, rt.Kind = v1alpha1.GroupVersion.String(), "Runtime"
	rt.Name, rt.Namespace = gitRuntime, runsNamespace
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("runtimes").Name(gitRuntime).Do(ctx).Error()
	})
	e.awaitRuntimesReady(t, installBound)

	wfs := e.watchWorkflowRuns(t)
	const doc = `metadata: {name: %s}
spec:
  source: {url: %q, commit: %q%s}
  jobs:
  - id: build
    runsOn: bash-git
    steps:
    - uses: checkout
    - run: 'test "$(cat VERSION)" = 2.0 && test ! -e /var/run/stoke-git-credentials && ! grep -q stoke-git-credentials /proc/self/mountinfo'
`
	named := fmt.Sprintf(", credentialsSecret: %s", gitSecret)
	e.mustCreateWorkflowRun(t, fmt.Sprintf(doc, "private", url, commit, named))
	e.mustCreateWorkflowRun(t, fmt.Sprintf(doc, "private-anon", url, commit, ""))
	e.mustCreateWorkflowRun(t, fmt.Sprintf(doc, "private-other", url, commit, ", credentialsSecret: someone-elses"))
	t.Cleanup(func() { e.deleteWorkflowRuns(t, "private", "private-anon", "private-other") })

	if wf := awaitWorkflowEnd(t, wfs, "private"); wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Errorf("private: %s\n%s", wf.Status.Phase, workflowText(wf))
	}
	if len(git.Authorizations()) == 0 {
		t.Error("the git server saw no credentials")
	}
	for _, c := range []struct{ name, want string }{
		{"private-anon", "materialising source: git: the repository asks for credentials: set spec.source.git.credentialsSecret to the Runtime's spec.git.credentialsSecret"},
		{"private-other", `"someone-elses" is not the Secret of Runtime bash-git (spec.git.credentialsSecret "git-creds")`},
	} {
		wf := awaitWorkflowEnd(t, wfs, c.name)
		text := workflowText(wf)
		if wf.Status.Phase != v1alpha1.WorkflowFailed || jobPhase(wf, "build") != v1alpha1.JobFailed || !strings.Contains(text, c.want) {
			t.Errorf("%s: %s, want Failed at the checkout saying %q:\n%s", c.name, wf.Status.Phase, c.want, text)
		}
		if strings.Contains(text, password) {
			t.Errorf("%s: the status holds the password", c.name)
		}
	}
}

// kubeSlowWorkflow is a job whose first step sleeps (sleep 4343, which
// the test finds among the host's processes: the node agent runs the
// Pods' containers as local processes) before a second step, and a job
// that needs it.
const kubeSlowWorkflow = `metadata: {name: %s}
spec:
  jobs:
  - id: first
    runsOn: bash
    steps:
    - {id: wait, run: 'echo started; sleep 4343'}
    - run: echo never
  - id: second
    needs: [first]
    runsOn: bash
    steps:
    - run: echo never
`

// Cancel mid-run on the cluster: spec.cancelRequested set (as `stoke
// workflow run`'s Ctrl-C does) while the first job's step sleeps; the
// WorkflowRun ends Cancelled, the running step and its Run Cancelled, the
// step after it and the job that needs it Skipped, and the sleep is gone.
func testWorkflowCancel(t *testing.T, e *kubeEnv) {
	const name = "cancel-mid-run"
	wfs := e.watchWorkflowRuns(t)
	runs := e.watchRuns(t, "stoke.dev/workflowrun="+name)
	e.mustCreateWorkflowRun(t, fmt.Sprintf(kubeSlowWorkflow, name))
	t.Cleanup(func() { e.deleteWorkflowRuns(t, name) })
	runs.until(t, runBound, "the sleeping step Running", func(m map[string]*v1alpha1.Run) bool {
		for _, r := range m {
			if r.Status.Phase == v1alpha1.PhaseRunning {
				return true
			}
		}
		return false
	})
	sleepers := processesRunning("sleep", "4343")
	if !awaitProcess(runBound, func() bool { return len(sleepers()) > 0 }) {
		t.Fatal("the step's sleep never ran on the host")
	}
	asked := time.Now()
	if err := e.stoke.Patch(types.MergePatchType).Namespace(runsNamespace).Resource("workflowruns").Name(name).
		Body([]byte(`{"spec":{"cancelRequested":true}}`)).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	wf := awaitWorkflowEnd(t, wfs, name)
	t.Logf("cancel asked → WorkflowRun %s in %v (loaded)", wf.Status.Phase, time.Since(asked).Round(time.Millisecond))
	if wf.Status.Phase != v1alpha1.WorkflowCancelled {
		t.Fatalf("%s:\n%s", wf.Status.Phase, workflowText(wf))
	}
	first := wf.Status.Jobs[slices.IndexFunc(wf.Status.Jobs, func(j v1alpha1.JobStatus) bool { return j.Name == "first" })]
	if first.Phase != v1alpha1.JobCancelled || len(first.Steps) != 2 || first.Steps[0].Phase != v1alpha1.JobCancelled || first.Steps[1].Phase != v1alpha1.JobSkipped {
		t.Errorf("first:\n%s", workflowText(wf))
	}
	if got := jobPhase(wf, "second"); got != v1alpha1.JobSkipped {
		t.Errorf("second: %s", got)
	}
	step := runs.until(t, runBound, "the step Run ends", func(m map[string]*v1alpha1.Run) bool {
		r := m[first.Steps[0].Run]
		return r != nil && terminal(r.Status.Phase)
	})[first.Steps[0].Run]
	if step.Status.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("the step Run %s: %s %s", step.Name, step.Status.Phase, step.Status.Message)
	}
	if left := awaitGone(runBound, sleepers); len(left) > 0 {
		t.Errorf("left running after the cancel:\n%s", describeProcesses(left))
	}
}

// Bad input through the API server, the standalone cases and more: what
// the CRD's schema and CEL can decide is refused at create (422, naming
// the field); what only internal/validation can (cycles, unknown needs,
// an expression that does not parse, a matrix over its bound) the
// controller refuses when the run starts: Failed, InvalidSpec, naming it,
// no step Run made; what only the step can find (a URL that is no
// repository, an artifact path leaving the workspace) fails that step,
// saying so.
func testWorkflowBadInput(t *testing.T, e *kubeEnv) {
	git := gittest.NewServer(t, gittest.Options{})
	commit, url := git.Commit(t, "app", map[string]string{"VERSION": "1\n"})
	job := func(body string) string { return "  jobs:\n  - {id: a, runsOn: bash, " + body + "}\n" }
	ok := "steps: [{run: 'true'}]"
	var axes []string
	for _, a := range []string{"x", "y"} {
		axes = append(axes, fmt.Sprintf("{name: %s, values: [%s]}", a, strings.TrimSuffix(strings.Repeat("1, ", 17), ", ")))
	}
	cases := []struct {
		name, spec string
		at         string // "create", "start" (InvalidSpec) or "step"
		want       string
	}{
		{"unknown-uses", job("steps: [{uses: actions/setup-go@v5}]"), "create", "spec.jobs[0].steps[0].uses"},
		{"checkout-escapes", fmt.Sprintf("  source: {url: %q, commit: %q, path: ../out}\n", url, commit) + job("steps: [{uses: checkout}]"), "create", "must not contain '..'"},
		{"cycle", "  jobs:\n  - {id: a, runsOn: bash, needs: [b], " + ok + "}\n  - {id: b, runsOn: bash, needs: [a], " + ok + "}\n", "start", "needs form a cycle: a → b → a"},
		{"unknown-needs", job("needs: [nope], " + ok), "start", `"nope"`},
		{"bad-expression", job("if: '${{ 1 + }}', " + ok), "start", "spec.jobs[0].if"},
		{"matrix-over-bound", job("strategy: {matrix: {axes: [" + strings.Join(axes, ", ") + "]}}, " + ok), "start", "over the bound of 256 combinations"},
		{"not-a-repository", fmt.Sprintf("  source: {url: %q, ref: main}\n", git.URL+"/none.git") + job("steps: [{uses: checkout}]"), "step", "none.git"},
		{"artifact-escapes", job("steps: [{uses: upload-artifact, with: [{name: name, value: x}, {name: path, value: ../../etc}]}]"), "step", "with.path"},
	}
	wfs := e.watchWorkflowRuns(t)
	var made []string
	t.Cleanup(func() { e.deleteWorkflowRuns(t, made...) })
	for _, c := range cases {
		name := "bad-" + c.name
		err := e.createWorkflowRun(context.Background(), fmt.Sprintf("metadata: {name: %s}\nspec:\n%s", name, c.spec))
		if c.at == "create" {
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: created (%v); want refused at create saying %q", c.name, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: refused at create (%v); want it %s", c.name, err, c.at)
			continue
		}
		made = append(made, name)
	}
	for _, c := range cases {
		name := "bad-" + c.name
		if c.at == "create" || !slices.Contains(made, name) {
			continue
		}
		wf := awaitWorkflowEnd(t, wfs, name)
		text := workflowText(wf)
		switch {
		case wf.Status.Phase != v1alpha1.WorkflowFailed || !strings.Contains(text, c.want):
			t.Errorf("%s: %s, want Failed saying %q:\n%s", c.name, wf.Status.Phase, c.want, text)
		case c.at == "start" && (wf.Status.Reason != "InvalidSpec" || slices.ContainsFunc(wf.Status.Jobs, func(j v1alpha1.JobStatus) bool { return len(j.Steps) > 0 && j.Steps[0].Run != "" })):
			t.Errorf("%s: want InvalidSpec at start with no step Run:\n%s", c.name, text)
		case c.at == "step" && jobPhase(wf, "a") != v1alpha1.JobFailed:
			t.Errorf("%s: want job a Failed at its step:\n%s", c.name, text)
		}
	}
}

// Killing the controller leader with SIGKILL while a workflow waits in
// its second job: another replica takes the Lease over and the workflow
// goes on where it was: Succeeded, each job's step ran exactly once
// (the marker file on the host has one line per execution), the first
// job at its first attempt.
func testWorkflowLeaderKilled(t *testing.T, e *kubeEnv) {
	const name = "leader-killed"
	dir := e.sharedDir(t)
	marker, gate := filepath.Join(dir, "marker"), filepath.Join(dir, "go")
	wfs := e.watchWorkflowRuns(t)
	leases := e.watchLeases(t, stokeNamespace)
	e.mustCreateWorkflowRun(t, fmt.Sprintf(`metadata: {name: %s}
spec:
  env: [{name: MARKER, value: %q}, {name: GATE, value: %q}]
  jobs:
  - id: a
    runsOn: bash
    steps: [{run: 'echo a >> "$MARKER"'}]
  - id: b
    needs: [a]
    runsOn: bash
    steps: [{run: 'echo b-started >> "$MARKER"; while [ ! -e "$GATE" ]; do sleep 0.05; done; echo b >> "$MARKER"'}]
  - id: c
    needs: [b]
    runsOn: bash
    steps: [{run: 'echo c >> "$MARKER"'}]
`, name, marker, gate))
	t.Cleanup(func() { e.deleteWorkflowRuns(t, name) })
	wfs.until(t, runBound, "job b running", func(m map[string]*v1alpha1.WorkflowRun) bool {
		wf := m[name]
		return wf != nil && jobPhase(wf, "a") == v1alpha1.JobSucceeded && jobPhase(wf, "b") == v1alpha1.JobRunning
	})

	holder := e.awaitLeader(t, runBound)
	victim := e.leaderPod(t, holder)
	if err := syscall.Kill(controllerProcess(t, victim), syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the leader (pod %s): %v", victim, err)
	}
	killed := time.Now()
	after := leases.until(t, loadBound, "a new leader", func(m map[string]*coordinationv1.Lease) bool {
		l := m[controllerName]
		return l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && *l.Spec.HolderIdentity != holder
	})[controllerName]
	t.Logf("leader %s (pod %s) killed; %s took over after %v (loaded)", holder, victim, *after.Spec.HolderIdentity, time.Since(killed).Round(time.Millisecond))
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wf := awaitWorkflowEnd(t, wfs, name)
	if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("%s:\n%s", wf.Status.Phase, workflowText(wf))
	}
	for _, j := range wf.Status.Jobs {
		if j.Phase != v1alpha1.JobSucceeded || j.Attempt != 1 {
			t.Errorf("job %s: %s attempt %d", j.Name, j.Phase, j.Attempt)
		}
	}
	lines := markerLines(t, marker)
	for _, l := range []string{"a", "b-started", "b", "c"} {
		if lines[l] != 1 {
			t.Errorf("marker %q written %d times, want once (all: %v)", l, lines[l], lines)
		}
	}
}
