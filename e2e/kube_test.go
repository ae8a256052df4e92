package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// TestKube is Kubernetes mode end to end, on one cluster with Stoke
// installed from the Helm chart (startKube). The subtests run in order: those
// that leave the cluster as they found it first, then the two that
// disturb it (a controller killed, the API server stopped), each of
// which also checks that everything recovered.
func TestKube(t *testing.T) {
	e := startKube(t)
	for _, st := range []struct {
		name string
		test func(*testing.T, *kubeEnv)
	}{
		{"ExamplesWithKubectl", testExamplesWithKubectl},
		{"CLI", testCLIOnCluster},
		{"HopRefusesStrangers", testHopRefusesStrangers},
		{"Profiles", testProfiles},
		{"FunctionSurvivesItsPod", testFunctionSurvivesItsPod},
		{"UserImage", testUserImage},
		{"ServiceAccountToken", testServiceAccountToken},
		{"LeaderKilled", testLeaderKilled},
		{"WorkflowPipeline", testWorkflowPipeline},
		{"WorkflowPrivateGit", testWorkflowPrivateGit},
		{"WorkflowCancel", testWorkflowCancel},
		{"WorkflowBadInput", testWorkflowBadInput},
		{"WorkflowLeaderKilled", testWorkflowLeaderKilled},
		{"WorkflowHashFiles", testWorkflowHashFiles},
		{"WorkflowCalls", testWorkflowCalls},
		{"APIServerStopped", testAPIServerStopped},
	} {
		t.Run(st.name, func(t *testing.T) { st.test(t, e) })
	}
}

// labelled puts the label e2e=value on run, so that a test follows only
// its own Runs.
func labelled(run *v1alpha1.Run, value string) *v1alpha1.Run {
	if run.Labels == nil {
		run.Labels = map[string]string{}
	}
	run.Labels["e2e"] = value
	return run
}

// phaseOf is the phase of the Run named name, "" if none.
func phaseOf(m map[string]*v1alpha1.Run, name string) v1alpha1.Phase {
	if r := m[name]; r != nil {
		return r.Status.Phase
	}
	return ""
}

// terminal reports whether a phase is final.
func terminal(p v1alpha1.Phase) bool {
	switch p {
	case v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed, v1alpha1.PhaseTimeout, v1alpha1.PhaseCancelled:
		return true
	}
	return false
}

// The examples, applied with kubectl as a user would: the task of
// examples/task.yaml (the same file `stoke apply` takes) ends Succeeded
// with its output, `kubectl get runs` shows the printer columns, and the
// Bash and Python functions of examples/ reach Ready and answer through
// runtimed's hop with the gateway's credential.
func testExamplesWithKubectl(t *testing.T, e *kubeEnv) {
	runs := e.watchRuns(t, "")
	e.cluster.Kubectl(t, "apply", "-f", repoPath("examples/task.yaml"))
	done := runs.until(t, runBound, "hello-task ends", func(m map[string]*v1alpha1.Run) bool {
		return terminal(phaseOf(m, "hello-task"))
	})["hello-task"]
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.ExitCode == nil || *done.Status.ExitCode != 0 ||
		done.Status.Outputs["GREETED"] != "stoke" || done.Status.Attempt != 1 {
		t.Fatalf("hello-task: %+v", done.Status)
	}

	// The columns of `stoke get runs` (MODE aside: a printer column is
	// one JSONPath), and the wide ones.
	table := e.cluster.Kubectl(t, "get", "runs")
	assertColumns(t, table, []string{"NAME", "RUNTIME", "PHASE", "ATTEMPT", "AGE"}, "hello-task", "bash", "Succeeded", "1")
	wide := e.cluster.Kubectl(t, "get", "runs", "-o", "wide")
	assertColumns(t, wide, []string{"NAME", "RUNTIME", "PHASE", "ATTEMPT", "AGE", "REASON", "EXIT", "POD", "ENDPOINT"},
		"hello-task", "bash", "Succeeded", "1", done.Status.AssignedPod)

	e.cluster.Kubectl(t, "apply", "-f", repoPath("examples/bash-function.yaml"), "-f", repoPath("examples/python-function.yaml"))
	ready := runs.until(t, runBound, "bash-echo and python-hello Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, "bash-echo") == v1alpha1.PhaseReady && phaseOf(m, "python-hello") == v1alpha1.PhaseReady
	})
	creds := e.gatewayCredentials(t)
	for _, c := range []struct{ name, input, key, want string }{
		{"bash-echo", `{"hello":"world"}`, "runtime", "bash"},
		{"python-hello", `{"name":"stoke"}`, "message", "hello, stoke"},
	} {
		run := ready[c.name]
		if run.Status.Endpoint == "" {
			t.Errorf("%s is Ready without an endpoint", c.name)
		}
		resp, err := invokeHop(e.gatewayConn(t, creds, run), run, c.input)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var out map[string]any
		if err := json.Unmarshal(resp.GetOutput(), &out); err != nil || out[c.key] != c.want {
			t.Errorf("%s answered %q (%v), want %s %q", c.name, resp.GetOutput(), err, c.key, c.want)
		}
	}
	for _, name := range []string{"hello-task", "bash-echo", "python-hello"} {
		e.deleteRun(t, name)
	}
}

// assertColumns checks a kubectl table's header and that the row of its
// first value holds every value.
func assertColumns(t *testing.T, table string, header []string, row ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != strings.Join(header, " ") {
		t.Errorf("kubectl get runs header %q, want %q", got, header)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != row[0] {
			continue
		}
		for _, v := range row[1:] {
			if !strings.Contains(" "+strings.Join(f, " ")+" ", " "+v+" ") {
				t.Errorf("kubectl get runs row %q lacks %q", l, v)
			}
		}
		return
	}
	t.Errorf("kubectl get runs has no row %s:\n%s", row[0], table)
}

// maxRecovery is the bound from a replacement Pod's readiness to
// the function serving on it again.
const maxRecovery = 5 * time.Second

// Deleting the runtime Pod under a Ready function registers it again on
// another Pod (attempt 2), and it serves there within 5 s of that Pod
// being Ready (as the test saw it, or of the deletion if the Pod was
// Ready before).
func testFunctionSurvivesItsPod(t *testing.T, e *kubeEnv) {
	runs := e.watchRuns(t, "e2e=survivor")
	pods := e.watchPods(t, runsNamespace, "stoke.dev/runtime=bash")
	fn := e.mustCreateRun(t, labelled(newRun("survivor", function("bash", "fn.handle", "fn.sh",
		`handle() { printf '{"got":%s}' "$1"; }`)), "survivor"))
	first := runs.until(t, runBound, "survivor Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})[fn.Name]
	if first.Status.Attempt != 1 {
		t.Fatalf("survivor Ready at attempt %d", first.Status.Attempt)
	}
	creds := e.gatewayCredentials(t)
	if _, err := invokeHop(e.gatewayConn(t, creds, first), first, `[1]`); err != nil {
		t.Fatal(err)
	}

	old := first.Status.AssignedPod
	deleted := time.Now()
	e.cluster.Kubectl(t, "delete", "pod", "-n", runsNamespace, old, "--wait=false")
	again := runs.until(t, runBound, "survivor Ready again on another pod", func(m map[string]*v1alpha1.Run) bool {
		r := m[fn.Name]
		return r != nil && r.Status.Phase == v1alpha1.PhaseReady && r.Status.AssignedPod != old
	})[fn.Name]
	resp, err := invokeHop(e.gatewayConn(t, creds, again), again, `[2]`)
	served := time.Now()
	if err != nil || string(resp.GetOutput()) != `{"got":[2]}` {
		t.Fatalf("survivor on %s: %v %v", again.Status.AssignedPod, resp, err)
	}
	if again.Status.Attempt != 2 {
		t.Errorf("survivor on its new pod at attempt %d, want 2", again.Status.Attempt)
	}
	podReadyAt, ok := pods.firstSeen(func(p *corev1.Pod) bool {
		_, ready := podReady(p)
		return p.Name == again.Status.AssignedPod && ready
	})
	if !ok {
		t.Fatalf("pod %s was never seen Ready", again.Status.AssignedPod)
	}
	from := podReadyAt
	if from.Before(deleted) {
		from = deleted
	}
	took := served.Sub(from)
	t.Logf("survivor: pod %s deleted; served on %s %v after it was Ready (deleted → served %v)",
		old, again.Status.AssignedPod, took.Round(time.Millisecond), served.Sub(deleted).Round(time.Millisecond))
	if took > maxRecovery {
		t.Errorf("survivor served %v after its new pod was Ready, want ≤ %v", took, maxRecovery)
	}
	e.deleteRun(t, fn.Name)
}

// The stoke CLI's end-to-end cases (cliCases, those TestCLI runs against
// stoke up) against the cluster, through the admin's kubeconfig as
// KUBECONFIG: the same commands, flags, output and exit codes. The Runs
// the cases leave are deleted at the end, with the CLI.
func testCLIOnCluster(t *testing.T, e *kubeEnv) {
	// The cases name their Runs as examples/ does: the Runs earlier
	// subtests deleted must be gone first.
	e.watchRuns(t, "").until(t, runBound, "no Runs left by earlier subtests", func(m map[string]*v1alpha1.Run) bool { return len(m) == 0 })
	s := kubeCLIServer(t, e)
	if !s.dataplane {
		t.Log("no gateway in deploy/: the steps that invoke, exec or read logs do not run")
	}
	runCLICases(t, s)
	if names := strings.Fields(s.ok(t, "get", "runs", "-o", "name")); len(names) > 0 {
		s.ok(t, append([]string{"delete", "--wait"}, names...)...)
	}
}
