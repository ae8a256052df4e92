package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/testdeps"
)

const lambdaAccessKey = "AKIDSTOKEE2E"

// startLambda starts a simulator and points the AWS configuration of the
// stoke up processes this test starts at it.
// opts change the simulator's configuration.
func startLambda(t testing.TB, concurrency int, opts ...func(*lambdasim.Config)) *lambdasim.Simulator {
	t.Helper()
	rie, err := testdeps.Path("aws-lambda-rie")
	if err != nil {
		t.Fatal(err)
	}
	cfg := lambdasim.Config{RIE: rie, Dir: t.TempDir(), AccessKeyID: lambdaAccessKey, Concurrency: concurrency}
	for _, o := range opts {
		o(&cfg)
	}
	sim, err := lambdasim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_LAMBDA": sim.URL(), "AWS_REGION": lambdasim.Region,
		"AWS_ACCESS_KEY_ID": lambdaAccessKey, "AWS_SECRET_ACCESS_KEY": "secret",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull, "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	return sim
}

// applyLambdaRuntime creates a lambda Runtime; bootstrap, when set, is what
// its functions package as bootstrap instead of the stoke binary.
func (u *stokeUp) applyLambdaRuntime(t testing.TB, name, inner, bootstrap string) {
	t.Helper()
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "lambda", Replicas: 1, Runs: 16,
		Lambda: &v1alpha1.LambdaSpec{Runtime: inner, Role: "arn:aws:iam::123456789012:role/stoke", Bootstrap: bootstrap}}}
	rt.APIVersion, rt.Kind = v1alpha1.GroupVersion.String(), v1alpha1.KindRuntime
	rt.Name, rt.Namespace = name, "default"
	if status, body, err := u.request(http.MethodPut, "/v1/namespaces/default/runtimes/"+name, rt); err != nil || status/100 != 2 {
		t.Fatalf("apply runtime %s: %d %s %v", name, status, body, err)
	}
}

// function is a function Run. A loaded machine can make a registration
// miss runtimed's register deadline; the retry policy covers that.
func function(runtime, handler, path, text string) v1alpha1.RunSpec {
	return v1alpha1.RunSpec{Runtime: runtime, Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: handler}},
		Source:      &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: path, Text: text}},
		RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 3}}
}

func noRetry(spec v1alpha1.RunSpec) v1alpha1.RunSpec {
	spec.RetryPolicy = nil
	return spec
}

func task(runtime, path, text string, args ...string) v1alpha1.RunSpec {
	return v1alpha1.RunSpec{Runtime: runtime, Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: path, Args: args}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: path, Text: text}}}
}

const lambdaCounter = `calls = 0

def handle(event, context):
    global calls
    calls += 1
    return {"calls": calls, "event": event}
`

const lambdaFail = `def handle(event):
    raise ValueError("no good: " + str(event))
`

// lambdaBlock tells the test it runs, then waits for three bytes.
const lambdaBlock = `import os

def handle(event):
    with open(event["started"], "w") as f:
        f.write("x\n")
    fd = os.open(event["release"], os.O_RDONLY)
    os.read(fd, 3)
    os.close(fd)
    return "released"
`

func TestLambdaRuntime(t *testing.T) {
	sim := startLambda(t, 100)
	dir := t.TempDir()
	u := startUp(t, dir, "--lambda-collect-interval", "1s")
	// The sandboxes run on this machine: a launcher of the stoke binary is
	// packaged instead of its tens of megabytes, which the simulator in this
	// test binary (built with -race) would otherwise decode at every
	// CreateFunction. BenchmarkLambdaInvoke packages the binary itself.
	launcher := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(launcher, []byte("#!/usr/bin/env bash\nexec -a bootstrap "+stokeBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u.applyLambdaRuntime(t, "lambda-python", "python", launcher)
	u.applyLambdaRuntime(t, "lambda-bash", "bash", launcher)
	w := u.watchRuns(t)
	defer func() { w.stop() }()

	for _, r := range []*v1alpha1.Run{
		newRun("counter", function("lambda-python", "m.handle", "m.py", lambdaCounter)),
		newRun("counter-twin", function("lambda-python", "m.handle", "m.py", lambdaCounter)),
		newRun("echo", function("lambda-bash", "h.handle", "h.sh", `handle() { printf '{"echo":%s}' "$1"; }`)),
		newRun("fail", function("lambda-python", "m.handle", "m.py", lambdaFail)),
		newRun("fail-local", function("python", "m.handle", "m.py", lambdaFail)),
		newRun("missing", noRetry(function("lambda-python", "m.nothere", "m.py", lambdaCounter))),
		newRun("task-ok", task("lambda-bash", "t.sh", "echo hello \"$1\"\necho RESULT=done >> \"$STOKE_OUTPUTS\"\n", "world")),
		newRun("task-fail", task("lambda-bash", "t.sh", "echo failing\nexit 3\n")),
	} {
		u.createRun(t, r)
	}
	runs := w.until(t, 180*time.Second, "functions Ready, tasks and the missing handler finished", func(runs map[string]*v1alpha1.Run) bool {
		for _, n := range []string{"counter", "counter-twin", "echo", "fail", "fail-local"} {
			if runs[n] == nil || runs[n].Status.Phase != v1alpha1.PhaseReady {
				return false
			}
		}
		for _, n := range []string{"missing", "task-ok", "task-fail"} {
			if runs[n] == nil || !runs[n].Status.Phase.Terminal() {
				return false
			}
		}
		return true
	})

	t.Run("TasksEndWithOutputsOrExitCode", func(t *testing.T) {
		ok, failed := runs["task-ok"], runs["task-fail"]
		if ok.Status.Phase != v1alpha1.PhaseSucceeded || ok.Status.Outputs["RESULT"] != "done" {
			t.Errorf("task-ok: %s %q outputs %v", ok.Status.Phase, ok.Status.Message, ok.Status.Outputs)
		}
		if failed.Status.Phase != v1alpha1.PhaseFailed || failed.Status.ExitCode == nil || *failed.Status.ExitCode != 3 {
			t.Errorf("task-fail: %s exit %v %q", failed.Status.Phase, failed.Status.ExitCode, failed.Status.Message)
		}
	})

	t.Run("MissingHandlerFailsWithTheInitError", func(t *testing.T) {
		m := runs["missing"]
		if m.Status.Phase != v1alpha1.PhaseFailed || !containsAll(m.Status.Message, "Runtime.InitError", "nothere") {
			t.Errorf("missing: %s %q", m.Status.Phase, m.Status.Message)
		}
	})

	client := &http.Client{Timeout: 60 * time.Second}
	t.Run("WarmInvocationsThroughTheGateway", func(t *testing.T) {
		for want := 1; want <= 3; want++ {
			res := invokeEndpoint(client, u.Token, runs["counter"].Status.Endpoint, `{"n":1}`)
			var out struct{ Calls int }
			if res.err != nil || res.status != http.StatusOK || json.Unmarshal(res.body, &out) != nil || out.Calls != want {
				t.Fatalf("counter invocation %d: %d %s %v", want, res.status, res.body, res.err)
			}
		}
		res := invokeEndpoint(client, u.Token, runs["echo"].Status.Endpoint, `{"a":"b"}`)
		if res.err != nil || res.status != http.StatusOK || string(res.body) != `{"echo":{"a":"b"}}` {
			t.Fatalf("bash echo: %d %s %v", res.status, res.body, res.err)
		}
	})

	t.Run("HandlerErrorIsTheLocal500", func(t *testing.T) {
		var bodies [2]httpapi.ErrorBody
		for i, n := range []string{"fail", "fail-local"} {
			res := invokeEndpoint(client, u.Token, runs[n].Status.Endpoint, `1`)
			if res.err != nil || res.status != http.StatusInternalServerError || json.Unmarshal(res.body, &bodies[i]) != nil {
				t.Fatalf("%s: %d %s %v", n, res.status, res.body, res.err)
			}
		}
		l, p := bodies[0], bodies[1]
		if l.ErrorType != p.ErrorType || l.ErrorMessage != p.ErrorMessage || l.ErrorType != "ValueError" || l.StackTrace == "" || l.InvocationID == "" {
			t.Errorf("lambda 500 body %+v; local %+v", l, p)
		}
	})

	t.Run("ConcurrencyLimitIs429", func(t *testing.T) {
		fifos := t.TempDir()
		started, release := openFIFO(t, filepath.Join(fifos, "started")), openFIFO(t, filepath.Join(fifos, "release"))
		for _, n := range []string{"block-1", "block-2", "block-3"} {
			u.createRun(t, newRun(n, function("lambda-python", "b.handle", "b.py", lambdaBlock)))
		}
		blocks := w.until(t, 120*time.Second, "blocking functions Ready", func(runs map[string]*v1alpha1.Run) bool {
			for _, n := range []string{"block-1", "block-2", "block-3"} {
				if runs[n] == nil || runs[n].Status.Phase != v1alpha1.PhaseReady {
					return false
				}
			}
			return true
		})
		sim.SetConcurrency(2)
		defer sim.SetConcurrency(100)
		ev, _ := json.Marshal(map[string]string{"started": started.Name(), "release": release.Name()})
		var wg sync.WaitGroup
		results := make([]invokeResult, 2)
		for i, n := range []string{"block-1", "block-2"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = invokeEndpoint(client, u.Token, blocks[n].Status.Endpoint, string(ev))
			}()
		}
		lines := bufio.NewReader(started)
		for range 2 {
			if _, err := lines.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		// The account's limit of 2 is reached: the third is refused at once.
		res := invokeEndpoint(client, u.Token, blocks["block-3"].Status.Endpoint, string(ev))
		if res.err != nil || res.status != http.StatusTooManyRequests {
			t.Errorf("third invocation past the limit: %d %s %v; want 429", res.status, res.body, res.err)
		}
		for range 2 {
			release.WriteString("go\n")
		}
		wg.Wait()
		for i, r := range results {
			if r.err != nil || r.status != http.StatusOK || string(r.body) != `"released"` {
				t.Errorf("blocked invocation %d: %d %s %v", i, r.status, r.body, r.err)
			}
		}
	})

	t.Run("DeletingTheRunsDeletesTheFunctions", func(t *testing.T) {
		before := len(sim.Functions())
		for _, n := range []string{"echo", "fail"} {
			if status, body := u.do(t, http.MethodDelete, "/v1/namespaces/default/runs/"+n, nil); status/100 != 2 {
				t.Fatalf("delete %s: %d %s", n, status, body)
			}
		}
		if !awaitFunctions(sim, 60*time.Second, func(fns []string) bool { return len(fns) == before-2 }) {
			t.Fatalf("functions after deleting two Runs: %v (were %d)", sim.Functions(), before)
		}
	})

	t.Run("Kill9LeavesNoFunctionBehind", func(t *testing.T) {
		// A task that blocks in its sandbox while stoke up is killed: its
		// function is left with no Runtime Server to delete it.
		gate := filepath.Join(t.TempDir(), "gate")
		if err := syscall.Mkfifo(gate, 0o600); err != nil {
			t.Fatal(err)
		}
		before := sim.Functions()
		u.createRun(t, newRun("stuck", task("lambda-bash", "t.sh", "read -r _ < "+gate+"\n")))
		var stuckFn string
		if !awaitFunctions(sim, 60*time.Second, func(fns []string) bool {
			for _, f := range fns {
				if !slices.Contains(before, f) {
					stuckFn = f
					return true
				}
			}
			return false
		}) {
			t.Fatalf("the stuck task's function did not appear: %v", sim.Functions())
		}
		w.stop()
		// As in a crash of the machine: the Runtime Servers die at once too,
		// before their parent-death signal could let them clean up.
		for _, p := range processesUnder(dir) {
			if slices.Contains(p.cmdline, "runtime-server") {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
		u.kill9(t)
		u = startUp(t, dir, "--lambda-collect-interval", "1s")
		w = u.watchRuns(t)
		w.until(t, 120*time.Second, "the stuck task ended", func(runs map[string]*v1alpha1.Run) bool {
			return runs["stuck"] != nil && runs["stuck"].Status.Phase.Terminal()
		})
		if !awaitFunctions(sim, 60*time.Second, func(fns []string) bool { return !slices.Contains(fns, stuckFn) }) {
			t.Fatalf("the stuck task's function %s is still there after the restart and the collector: %v", stuckFn, sim.Functions())
		}
		// Deleting every Run leaves nothing in the account.
		_, body := u.do(t, http.MethodGet, "/v1/namespaces/default/runs", nil)
		var list v1alpha1.RunList
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatal(err)
		}
		for _, r := range list.Items {
			if status, body := u.do(t, http.MethodDelete, "/v1/namespaces/default/runs/"+r.Name, nil); status/100 != 2 {
				t.Fatalf("delete %s: %d %s", r.Name, status, body)
			}
		}
		if !awaitFunctions(sim, 90*time.Second, func(fns []string) bool { return len(fns) == 0 }) {
			t.Fatalf("functions after deleting every Run: %v; want none", sim.Functions())
		}
	})
}

func openFIFO(t *testing.T, path string) *os.File {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// awaitFunctions polls the simulator (deletes by the collector and by
// Runtime Servers in other processes have no event here) until ok holds.
func awaitFunctions(sim *lambdasim.Simulator, bound time.Duration, ok func([]string) bool) bool {
	deadline := time.Now().Add(bound)
	for !ok(sim.Functions()) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // state of other processes
	}
	return true
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestLambdaSetupFailureAndCancel: a task whose function Lambda refuses
// never ran, so it fails with reason BackendSetupFailed, which the default
// retry policy retries like the other infrastructure failures (it used to
// end NonZeroExit, exit code 1, as if the program had failed, and was not
// retried); and `stoke cancel --wait` of a task whose CreateFunction hangs
// ends the Run Cancelled within the 1 s (it took the relay's 10 s
// kill grace and reported 137).
func TestLambdaSetupFailureAndCancel(t *testing.T) {
	var (
		mu       sync.Mutex
		hold     bool
		refuse   int // CreateFunction calls still to refuse
		held     = make(chan struct{})
		holdOnce sync.Once
	)
	refuseNext := func() {
		mu.Lock()
		refuse = 1
		mu.Unlock()
	}
	startLambda(t, 100, func(c *lambdasim.Config) {
		c.BeforeCreate = func(ctx context.Context, _ string) *lambdasim.Refusal {
			mu.Lock()
			h, r := hold, refuse > 0
			refuse = max(0, refuse-1)
			mu.Unlock()
			if h {
				holdOnce.Do(func() { close(held) })
				<-ctx.Done() // hangs until the caller gives up
				return &lambdasim.Refusal{Status: http.StatusInternalServerError, Type: "ServiceException", Message: "held"}
			}
			if r {
				return &lambdasim.Refusal{Status: http.StatusForbidden, Type: "AccessDeniedException", Message: "refused by the test"}
			}
			return nil
		}
	})
	u := startUp(t, t.TempDir())
	launcher := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(launcher, []byte("#!/usr/bin/env bash\nexec -a bootstrap "+stokeBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u.applyLambdaRuntime(t, "lambda-bash", "bash", launcher)
	w := u.watchRuns(t)

	// One at a time, each one's first CreateFunction refused.
	ended := func(name string) func(map[string]*v1alpha1.Run) bool {
		return func(runs map[string]*v1alpha1.Run) bool {
			return runs[name] != nil && runs[name].Status.Phase.Terminal()
		}
	}
	refuseNext()
	u.createRun(t, newRun("refused", task("lambda-bash", "t.sh", "echo never\n")))
	w.until(t, 120*time.Second, "the refused task ended", ended("refused"))
	retried := task("lambda-bash", "t.sh", "echo ran\n")
	retried.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 2} // the default retryable reasons
	refuseNext()
	u.createRun(t, newRun("retried", retried))
	runs := w.until(t, 120*time.Second, "the retried task ended", ended("retried"))
	if r := runs["refused"]; r.Status.Phase != v1alpha1.PhaseFailed || r.Status.Reason != string(retry.BackendSetupFailed) ||
		r.Status.ExitCode == nil || *r.Status.ExitCode != -1 || !containsAll(r.Status.Message, "AccessDeniedException", "refused by the test") {
		t.Errorf("refused: %s / %s, exit %v, %q; want Failed / BackendSetupFailed, -1, with AWS's refusal", r.Status.Phase, r.Status.Reason, r.Status.ExitCode, r.Status.Message)
	}
	if r := runs["retried"]; r.Status.Phase != v1alpha1.PhaseSucceeded || r.Status.Attempt != 2 {
		t.Errorf("retried: %s / %s attempt %d, %q; want Succeeded at attempt 2", r.Status.Phase, r.Status.Reason, r.Status.Attempt, r.Status.Message)
	}
	sawRetry := false
	for _, ev := range w.events("retried") {
		sawRetry = sawRetry || (ev.run.Status.Phase == v1alpha1.PhasePending && ev.run.Status.Reason == string(retry.BackendSetupFailed))
	}
	if !sawRetry {
		t.Errorf("retried: never Pending with reason BackendSetupFailed")
	}

	mu.Lock()
	hold = true
	mu.Unlock()
	u.createRun(t, newRun("held", task("lambda-bash", "t.sh", "echo held\n")))
	select {
	case <-held:
	case <-time.After(120 * time.Second):
		t.Fatal("the held task's CreateFunction was never called")
	}
	c, err := client.New(client.Config{Server: u.URL, Token: u.Token})
	if err != nil {
		t.Fatal(err)
	}
	// What `stoke cancel held --wait` does, bounded by the 1 s.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := cli.Cancel(ctx, c, "default", "held", true, cli.Streams{Out: &out, Err: &out}); err != nil {
		t.Fatalf("cancel --wait of a task whose CreateFunction hangs: %v (%s)", err, out.String())
	}
	if got := out.String(); got != "run/held Cancelled\n" {
		t.Fatalf("cancel --wait printed %q; want run/held Cancelled", got)
	}
}
