package up_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/testbin"
)

const taskYAML = `apiVersion: stoke.dev/v1alpha1
kind: Run
metadata:
  generateName: task-
spec:
  runtime: bash
  mode:
    task:
      args: ["bash", "-c", "echo out; echo err >&2; echo K=V >> \"$STOKE_OUTPUTS\""]
`

func TestTaskThroughTheAPI(t *testing.T) {
	s := startUp(t)
	created := s.create(t, taskYAML)
	if !strings.HasPrefix(created.Name, "task-") || len(created.Name) != len("task-")+5 {
		t.Errorf("generated name %q", created.Name)
	}
	// Following the log ends once the task has ended and its output is in.
	recs := s.logRecords(t, created.Name, true)
	got := map[string]bool{}
	for _, r := range recs {
		got[r["stream"].(string)+":"+str(r["line"])] = true
		if r["attempt"] != float64(1) {
			t.Errorf("record %v: want attempt 1", r)
		}
	}
	last := recs[len(recs)-1]
	if !got["stdout:out"] || !got["stderr:err"] || last["stream"] != "exit" || last["exitCode"] != float64(0) {
		t.Errorf("log records %v", recs)
	}
	r := s.do(t, http.MethodGet, "/v1/namespaces/default/runs/"+created.Name, "", nil)
	var run v1alpha1.Run
	if err := json.Unmarshal(r.body, &run); err != nil || r.status != http.StatusOK {
		t.Fatalf("get: %s", r)
	}
	if run.Status.Phase != v1alpha1.PhaseSucceeded || run.Status.Outputs["K"] != "V" || run.Status.ExitCode == nil || *run.Status.ExitCode != 0 {
		t.Errorf("status %+v", run.Status)
	}
	all := s.do(t, http.MethodGet, "/v1/runs", "", nil)
	if all.status != http.StatusOK || !bytes.Contains(all.body, []byte(created.Name)) {
		t.Errorf("list of every namespace: %s", all)
	}
	sel := s.do(t, http.MethodGet, "/v1/namespaces/default/runs?phase=Failed", "", nil)
	if bytes.Contains(sel.body, []byte(created.Name)) {
		t.Errorf("phase=Failed lists the Succeeded Run: %s", sel)
	}

	r = s.do(t, http.MethodDelete, "/v1/namespaces/default/runs/"+created.Name, "", nil)
	var asItWas v1alpha1.Run
	if err := json.Unmarshal(r.body, &asItWas); err != nil || r.status != http.StatusAccepted || asItWas.UID != created.UID {
		t.Fatalf("delete: %s", r)
	}
	// From the version the delete answered with, the watch shows the end.
	gone := s.watchFrom(t, asItWas.ResourceVersion, func(typ string, run *v1alpha1.Run) bool { return typ == "DELETED" && run.Name == created.Name })
	if gone.UID != created.UID {
		t.Errorf("deleted uid %s, want %s", gone.UID, created.UID)
	}
	if r := s.do(t, http.MethodGet, "/v1/namespaces/default/runs/"+created.Name, "", nil); r.status != http.StatusNotFound {
		t.Errorf("get after delete: %s", r)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "logs", string(created.UID)+".log")); !os.IsNotExist(err) {
		t.Errorf("the log outlived its Run: %v", err)
	}
}

func str(v any) string { s, _ := v.(string); return s }

func TestCancelThroughTheAPI(t *testing.T) {
	s := startUp(t)
	created := s.create(t, strings.Replace(taskYAML, `["bash", "-c", "echo out; echo err >&2; echo K=V >> \"$STOKE_OUTPUTS\""]`, `["sleep", "1000"]`, 1))
	s.waitPhase(t, created.Name, v1alpha1.PhaseRunning)
	r := s.do(t, http.MethodPost, "/v1/namespaces/default/runs/"+created.Name+"/cancel", "", nil)
	var run v1alpha1.Run
	if err := json.Unmarshal(r.body, &run); err != nil || r.status != http.StatusOK || !run.Spec.CancelRequested {
		t.Fatalf("cancel: %s", r)
	}
	ended := s.waitPhase(t, created.Name, v1alpha1.PhaseCancelled, v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if ended.Status.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("phase %s, want Cancelled", ended.Status.Phase)
	}
}

const bashFunctionYAML = `apiVersion: stoke.dev/v1alpha1
kind: Run
metadata:
  name: echo
spec:
  runtime: bash
  mode:
    function:
      handler: handler.handle
  source:
    inline:
      path: handler.sh
      text: |
        handle() { echo "got $1" >&2; printf '{"echo":%s}' "$1"; }
`

func TestFunctionThroughTheAPI(t *testing.T) {
	s := startUp(t)
	created := s.create(t, bashFunctionYAML)
	ready := s.waitPhase(t, created.Name, v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	want := s.url + "/v1/namespaces/default/runs/echo/" + string(created.UID) + "/invoke"
	if ready.Status.Phase != v1alpha1.PhaseReady || ready.Status.Endpoint != want {
		t.Fatalf("phase %s endpoint %q; want Ready at %q", ready.Status.Phase, ready.Status.Endpoint, want)
	}
	r := s.do(t, http.MethodPost, strings.TrimPrefix(ready.Status.Endpoint, s.url), `{"n":1}`,
		map[string]string{"X-Stoke-Invocation-ID": "inv-1", "Content-Type": "application/x-www-form-urlencoded"})
	if r.status != http.StatusOK || string(r.body) != `{"echo":{"n":1}}` || r.header.Get("X-Stoke-Invocation-ID") != "inv-1" {
		t.Fatalf("invoke: %s %v", r, r.header)
	}
	// A Bash call's stderr reaches the log just after its answer, so
	// follow the log until the line comes.
	if rec := s.followUntil(t, "echo", func(rec map[string]any) bool { return str(rec["line"]) == `got {"n":1}` }); rec["invocationId"] != "inv-1" {
		t.Errorf("function log record %v, want invocationId inv-1", rec)
	}
	m := s.do(t, http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{`stoke_invocations_total{code="200"} 1`, `stoke_runs{phase="Ready"} 1`, "stoke_scheduling_duration_seconds_count 1",
		"stoke_scheduler_waiting_runs 0",
		"stoke_scheduler_unschedulable_total ", "stoke_scheduler_conflicts_total "} { // a loaded start may mark or conflict
		if !strings.Contains(string(m.body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The pods' Runtime Server metrics, scraped over their Unix sockets,
	// are on the same authenticated /metrics, labelled with their pod
	// (labels in name order).
	pod := `namespace="default",pod="[a-z0-9-]+",runtime="bash"`
	for _, want := range []string{
		`stoke_runtime_invocations_total\{namespace="default",pod="[a-z0-9-]+",result="ok",runtime="bash"\} 1\n`,
		`stoke_runtime_invocation_duration_seconds_count\{namespace="default",pod="[a-z0-9-]+",result="ok",runtime="bash"\} 1\n`,
		`stoke_runtime_registrations\{` + pod + `,state="ready"\} 1\n`,
		`stoke_runtime_invocations_in_flight\{` + pod + `\} 0\n`,
		`stoke_runtime_server_up\{` + pod + `\} 1\n`,
	} {
		if !regexp.MustCompile(want).Match(m.body) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", m.body)
	}
}

func TestRuntimeThroughTheAPI(t *testing.T) {
	s := startUp(t)
	rt := `{"spec":{"server":"bash","replicas":1,"runs":2}}`
	r := s.do(t, http.MethodPut, "/v1/namespaces/default/runtimes/small", rt, nil)
	var got v1alpha1.Runtime
	if err := json.Unmarshal(r.body, &got); err != nil || r.status != http.StatusOK || got.Name != "small" || got.Spec.Runs != 2 {
		t.Fatalf("apply: %s", r)
	}
	r = s.do(t, http.MethodPut, "/v1/namespaces/default/runtimes/small", `{"spec":{"server":"bash","replicas":1,"runs":4}}`, nil)
	if err := json.Unmarshal(r.body, &got); err != nil || r.status != http.StatusOK || got.Spec.Runs != 4 {
		t.Fatalf("re-apply: %s", r)
	}
	if r := s.do(t, http.MethodGet, "/v1/namespaces/default/runtimes", "", nil); !bytes.Contains(r.body, []byte(`"small"`)) {
		t.Errorf("list: %s", r)
	}
	if r := s.do(t, http.MethodDelete, "/v1/namespaces/default/runtimes/small", "", nil); r.status != http.StatusAccepted {
		t.Fatalf("delete: %s", r)
	}
	if r := s.do(t, http.MethodGet, "/v1/namespaces/default/runtimes/small", "", nil); r.status != http.StatusNotFound {
		t.Errorf("get after delete: %s", r)
	}
}

// Every refused request gets its documented status and changes nothing:
// no Run is created and no invocation reaches the function.
func TestBadInputChangesNothing(t *testing.T) {
	s := startUp(t)
	fn := s.create(t, strings.Replace(bashFunctionYAML, `handle() { echo "got $1" >&2; printf '{"echo":%s}' "$1"; }`,
		`n=0; handle() { echo invoked >> "$COUNT"; printf 1; }`, 1)+"  env:\n  - name: COUNT\n    value: "+filepath.Join(t.TempDir(), "count")+"\n")
	fn = s.waitPhase(t, fn.Name, v1alpha1.PhaseReady)
	countFile := fn.Spec.Env[0].Value
	invoke := strings.TrimPrefix(fn.Status.Endpoint, s.url)
	runsBefore := len(s.runs(t))

	yaml := map[string]string{"Content-Type": "application/yaml"}
	tests := []struct {
		name         string
		method, path string
		body         string
		hdr          map[string]string
		status       int
		errorType    string
	}{
		{"no token", "GET", "/v1/namespaces/default/runs", "", map[string]string{"Authorization": ""}, 401, "Stoke.Unauthenticated"},
		{"wrong token", "POST", "/v1/namespaces/default/runs", taskYAML, map[string]string{"Authorization": "Bearer nope", "Content-Type": "application/yaml"}, 401, "Stoke.Unauthenticated"},
		{"wrong token on invoke", "POST", invoke, `1`, map[string]string{"Authorization": "Bearer " + s.token + "x"}, 401, "Stoke.Unauthenticated"},
		{"not bearer", "GET", "/metrics", "", map[string]string{"Authorization": "Basic " + s.token}, 401, "Stoke.Unauthenticated"},
		{"bad YAML", "POST", "/v1/namespaces/default/runs", "spec: [unclosed", yaml, 400, "Stoke.InvalidArgument"},
		{"bad JSON", "POST", "/v1/namespaces/default/runs", `{"spec":`, nil, 400, "Stoke.InvalidArgument"},
		{"unknown field", "POST", "/v1/namespaces/default/runs", strings.Replace(taskYAML, "runtime: bash", "runtime: bash\n  runtim: bash", 1), yaml, 400, "Stoke.InvalidArgument"},
		{"unknown runtime", "POST", "/v1/namespaces/default/runs", strings.Replace(taskYAML, "runtime: bash", "runtime: cobol", 1), yaml, 400, "Stoke.InvalidArgument"},
		{"invalid spec", "POST", "/v1/namespaces/default/runs", strings.Replace(taskYAML, "generateName: task-", "name: Not_A_Name", 1), yaml, 400, "Stoke.InvalidArgument"},
		{"namespace mismatch", "POST", "/v1/namespaces/default/runs", strings.Replace(taskYAML, "metadata:", "metadata:\n  namespace: other", 1), yaml, 400, "Stoke.InvalidArgument"},
		{"unsupported content type", "POST", "/v1/namespaces/default/runs", taskYAML, map[string]string{"Content-Type": "text/plain"}, 400, "Stoke.InvalidArgument"},
		{"object too large", "POST", "/v1/namespaces/default/runs", `{"x":"` + strings.Repeat("a", bounds.ObjectBody) + `"}`, nil, 413, "Stoke.InvalidArgument"},
		{"name taken", "POST", "/v1/namespaces/default/runs", bashFunctionYAML, yaml, 409, "Stoke.AlreadyExists"},
		{"no such run", "GET", "/v1/namespaces/default/runs/nope", "", nil, 404, "Stoke.NotFound"},
		{"cancel no such run", "POST", "/v1/namespaces/default/runs/nope/cancel", "", nil, 404, "Stoke.NotFound"},
		{"bad label selector", "GET", "/v1/namespaces/default/runs?labelSelector=a%20in", "", nil, 400, "Stoke.InvalidArgument"},
		{"invoke wrong uid", "POST", "/v1/namespaces/default/runs/echo/0000-wrong/invoke", `1`, nil, 404, "Stoke.NotFound"},
		{"invoke wrong name", "POST", strings.Replace(invoke, "/echo/", "/other/", 1), `1`, nil, 404, "Stoke.NotFound"},
		{"invocation id too long", "POST", invoke, `1`, map[string]string{"X-Stoke-Invocation-ID": strings.Repeat("i", bounds.InvocationID+1)}, 400, "Stoke.InvalidArgument"},
		{"invoke body too large", "POST", invoke, strings.Repeat("1", bounds.InvokeBody+1), nil, 413, "Stoke.InvalidArgument"},
		{"invoke not JSON", "POST", invoke, `{nope`, nil, 400, "Stoke.InvalidArgument"},
		{"invoke bad timeout", "POST", invoke, `1`, map[string]string{"X-Stoke-Timeout-Ms": "-5"}, 400, "Stoke.InvalidArgument"},
		{"runtime with a bad spec", "PUT", "/v1/namespaces/default/runtimes/bad", `{"spec":{"server":"cobol","replicas":1,"runs":1}}`, nil, 400, "Stoke.InvalidArgument"},
		{"runtime name mismatch", "PUT", "/v1/namespaces/default/runtimes/bad", `{"metadata":{"name":"other"},"spec":{"server":"bash","replicas":1,"runs":1}}`, nil, 400, "Stoke.InvalidArgument"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(t, tc.method, tc.path, tc.body, tc.hdr)
			if r.status != tc.status {
				t.Fatalf("status %s; want %d", r, tc.status)
			}
			var body struct{ ErrorType, ErrorMessage string }
			if err := json.Unmarshal(r.body, &body); err != nil || body.ErrorType != tc.errorType || body.ErrorMessage == "" {
				t.Errorf("error body %s; want errorType %s and a message", r.body, tc.errorType)
			}
			if strings.HasSuffix(tc.path, "/invoke") && r.header.Get("X-Stoke-Invocation-ID") == "" && tc.status != 401 {
				t.Errorf("an invoke error without an invocation ID")
			}
		})
	}
	if n := len(s.runs(t)); n != runsBefore {
		t.Errorf("%d Runs after refused requests, want %d", n, runsBefore)
	}
	if r := s.do(t, http.MethodGet, "/v1/namespaces/default/runtimes/bad", "", nil); r.status != http.StatusNotFound {
		t.Errorf("a refused Runtime exists: %s", r)
	}
	if b, err := os.ReadFile(countFile); !os.IsNotExist(err) {
		t.Errorf("the function was invoked by a refused request: %q %v", b, err)
	}
	if r := s.do(t, http.MethodPost, invoke, `1`, nil); r.status != http.StatusOK {
		t.Errorf("a good invoke after the refusals: %s", r)
	}
}

// 64 invocations at once on one function: one runs, 63 get 429 without
// waiting for it, and no process or goroutine is left behind.
func TestConcurrentInvokesOneRunsTheRestGet429(t *testing.T) {
	s := startUp(t)
	gate := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	fn := s.create(t, `apiVersion: stoke.dev/v1alpha1
kind: Run
metadata:
  name: gated
spec:
  runtime: python
  mode:
    function:
      handler: gated.handle
  env:
  - name: GATE
    value: `+gate+`
  source:
    inline:
      path: gated.py
      text: |
        import os
        calls = 0
        def handle(event, context):
            global calls
            calls += 1
            with open(os.environ["GATE"]) as f:
                f.read()
            return {"calls": calls}
`)
	fn = s.waitPhase(t, fn.Name, v1alpha1.PhaseReady)
	// The registration took the pod's spare Python worker, and the pod
	// makes the next one after it: counted once it is there.
	awaitIdleSpares(t)
	procsBefore := descendants(t)

	const n = 64
	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { replies <- s.do(t, http.MethodPost, strings.TrimPrefix(fn.Status.Endpoint, s.url), `{}`, nil) })
	}
	// The one admitted waits at the gate until every other has its answer.
	for i := range n - 1 {
		r := <-replies
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("reply %d while one invocation holds the function: %s", i, r)
		}
		var body struct{ ErrorType string }
		if json.Unmarshal(r.body, &body); body.ErrorType != "Stoke.ResourceExhausted" || r.header.Get("X-Stoke-Invocation-ID") == "" {
			t.Errorf("429 body %s headers %v", r.body, r.header)
		}
	}
	g, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	wg.Wait()
	if r := <-replies; r.status != http.StatusOK || string(r.body) != `{"calls":1}` {
		t.Errorf("the admitted invocation: %s", r)
	}
	if after := descendants(t); after != procsBefore {
		t.Errorf("%d descendant processes after the invocations, %d before", after, procsBefore)
	}
	m := s.do(t, http.MethodGet, "/metrics", "", nil)
	if !strings.Contains(string(m.body), `stoke_invocations_total{code="429"} 63`) {
		t.Errorf("/metrics does not count 63 rejections")
	}
}

// awaitIdleSpares waits until the pods' spare Python workers are idle
// (testbin.AwaitPythonSparesIdle) and returns how long that took.
func awaitIdleSpares(t testing.TB) time.Duration {
	t.Helper()
	d, err := testbin.AwaitPythonSparesIdle(os.Getpid(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// descendants counts the processes below this test process.
func descendants(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the last ')' are: state ppid ...
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			parent[pid] = ppid
		}
	}
	self, count := os.Getpid(), 0
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == self {
				count++
				break
			}
		}
	}
	return count
}
