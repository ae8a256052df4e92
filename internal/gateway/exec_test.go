package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/channel"
	"stoke.dev/stoke/internal/exec/exectest"
	"stoke.dev/stoke/internal/gateway"
)

var execRuns atomic.Int64

// execTask creates a task Run that sleeps until cancelled and waits until
// it runs.
func execTask(t *testing.T) exectest.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	name := fmt.Sprintf("exec-%d", execRuns.Add(1))
	_, err := plane.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"sleep", "100000"}}},
			Env: []v1alpha1.EnvVar{{Name: "RUN_VAR", Value: "run-value"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", name) })
	run := awaitPhase(t, name, v1alpha1.PhaseRunning)
	var dir string
	for _, p := range plane.Pods() {
		if p.UID == run.Status.AssignedPodUID {
			dir = filepath.Join(p.WorkspaceRoot, string(run.UID))
		}
	}
	return exectest.Run{UID: "default/" + name, Dir: dir, Env: map[string]string{"RUN_VAR": "run-value"},
		End: func(t *testing.T) {
			if _, err := plane.CancelRun(context.Background(), "default", name); err != nil {
				t.Errorf("cancel %s: %v", name, err)
			}
			awaitPhase(t, name, v1alpha1.PhaseCancelled)
		}}
}

// awaitPhase polls the Run (the cache has no event for a test to await)
// until it reaches phase.
func awaitPhase(t *testing.T, name string, phase v1alpha1.Phase) *v1alpha1.Run {
	t.Helper()
	deadline := time.Now().Add(exectest.Timeout)
	for {
		run, ok := plane.CachedRun("default", name)
		if ok && run.Status.Phase == phase {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s did not reach %s: %+v", name, phase, run)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func execClient(t *testing.T, url string) *client.Client {
	c, err := client.New(client.Config{Server: url, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The suite through the gateway's WebSocket, runtimed's hop and a real
// runtime pod.
func TestExec(t *testing.T) {
	url := serve(t, gateway.Config{Exec: plane})
	exectest.Test(t, exectest.Harness{Executor: execClient(t, url).Exec(), Task: execTask})
}

// 256 MiB through cat each way with a reader that stalls for a second at a
// time: all of it comes back, and the memory of this process (the gateway
// and the control plane) and of the pod grows by a bounded amount.
func TestExecBackpressure(t *testing.T) {
	url := serve(t, gateway.Config{Exec: plane})
	pids := []int{os.Getpid()}
	// The runtime pod is the parent of what an exec runs.
	x := execClient(t, url).Exec()
	probe := execTask(t)
	out, _, _, err := exectest.Collect(context.Background(), x, exec.Request{RunUID: probe.UID, Command: []string{"bash", "-c", "echo $PPID"}}, nil)
	pod, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || perr != nil {
		t.Fatalf("finding the pod: %q %v", out, err)
	}
	probe.End(t)
	pids = append(pids, pod)
	before := make([]int, len(pids))
	for i, pid := range pids {
		// Reset the peak RSS, so that VmHWM below is this test's peak.
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
		before[i] = procKiB(t, pid, "VmRSS")
	}
	exectest.Backpressure(t, exectest.Harness{Executor: execClient(t, url).Exec(), Task: execTask, BigBytes: 256 << 20})
	for i, pid := range pids {
		growth := (procKiB(t, pid, "VmHWM") - before[i]) >> 10
		t.Logf("pid %d (%s): peak RSS grew by %d MiB", pid, map[bool]string{true: "test process", false: "runtime pod"}[i == 0], growth)
		if growth > 64 {
			t.Errorf("pid %d: peak RSS grew by %d MiB moving 256 MiB", pid, growth)
		}
	}
}

func procKiB(t *testing.T, pid int, field string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok { // a kB figure or a number
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// client-go's WebSocket executor, as kubectl exec uses it, is a judge of
// the protocol: stdin to EOF, stdout and stderr apart, the exit code in a
// NonZeroExitCode status, and a TTY with its size.
func TestExecClientGo(t *testing.T) {
	base := serve(t, gateway.Config{Exec: plane})
	run := execTask(t)
	name := strings.TrimPrefix(run.UID, "default/")
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	cfg := &rest.Config{Host: base, BearerToken: token}
	execURL := func(q url.Values) *url.URL {
		u, _ := url.Parse(base + "/v1/namespaces/default/runs/" + name + "/exec?" + q.Encode())
		return u
	}

	q := url.Values{"command": {"bash", "-c", "wc -c; echo oops >&2; exit 3"}, "stdin": {"true"}, "stdout": {"true"}, "stderr": {"true"}}
	x, err := remotecommand.NewWebSocketExecutor(cfg, "GET", execURL(q).String())
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("hello"), Stdout: &out, Stderr: &errOut})
	var exitErr utilexec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitStatus() != 3 {
		t.Fatalf("client-go: %v, want exit status 3", err)
	}
	if out.String() != "5\n" || errOut.String() != "oops\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}

	// A resize reaches the terminal: the command prints its size on
	// SIGWINCH, and the size is sent once it said it is ready.
	q = url.Values{"command": {"bash", "-c", `trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done`},
		"stdout": {"true"}, "tty": {"true"}}
	x, err = remotecommand.NewWebSocketExecutor(cfg, "GET", execURL(q).String())
	if err != nil {
		t.Fatal(err)
	}
	sizes := make(sizeQueue, 1)
	defer close(sizes)
	screen := &onReady{Screen: exectest.NewScreen(), sizes: sizes}
	err = x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: screen, Tty: true, TerminalSizeQueue: sizes})
	if err != nil {
		t.Fatalf("tty: %v", err)
	}
	screen.Expect(t, "45 123")
}

type sizeQueue chan *remotecommand.TerminalSize

func (q sizeQueue) Next() *remotecommand.TerminalSize { return <-q }

// onReady sends a resize once the command says it is ready.
type onReady struct {
	*exectest.Screen
	sizes sizeQueue
	sent  bool
}

func (o *onReady) Write(p []byte) (int, error) {
	n, err := o.Screen.Write(p)
	if !o.sent && bytes.Contains(p, []byte("ready")) {
		o.sent = true
		o.sizes <- &remotecommand.TerminalSize{Width: 123, Height: 45}
	}
	return n, err
}

// Refusals before the upgrade are the JSON error with the documented
// status; nothing about the Run changes.
func TestExecErrors(t *testing.T) {
	metrics := gateway.NewMetrics(plane.RunPhases)
	base := serve(t, gateway.Config{Exec: plane, Metrics: metrics})
	run := execTask(t)
	name := strings.TrimPrefix(run.UID, "default/")
	done, err := plane.CreateRun(context.Background(), &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name + "-done", Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", done.Name) })
	awaitPhase(t, done.Name, v1alpha1.PhaseSucceeded)

	ws := "ws" + strings.TrimPrefix(base, "http")
	ok := "?command=true&stdout=true"
	tests := []struct {
		name, path, query string
		hdr               http.Header
		protocols         []string
		status            int
		errorType         string
	}{
		{"NoToken", name, ok, http.Header{"Authorization": nil}, nil, 401, "Stoke.Unauthenticated"},
		{"WrongToken", name, ok, http.Header{"Authorization": {"Bearer nope"}}, nil, 401, "Stoke.Unauthenticated"},
		{"CrossOrigin", name, ok, http.Header{"Origin": {"https://evil.example"}}, nil, 403, "Stoke.PermissionDenied"},
		{"UnknownRun", "no-such-run", ok, nil, nil, 404, "Stoke.NotFound"},
		{"FinishedRun", done.Name, ok, nil, nil, 409, "Stoke.FailedPrecondition"},
		{"EmptyCommand", name, "?stdout=true", nil, nil, 400, "Stoke.InvalidArgument"},
		{"EmptyArgv0", name, "?command=&stdout=true", nil, nil, 400, "Stoke.InvalidArgument"},
		{"NoStreams", name, "?command=true", nil, nil, 400, "Stoke.InvalidArgument"},
		{"TTYWithStderr", name, "?command=true&stdout=true&stderr=true&tty=true", nil, nil, 400, "Stoke.InvalidArgument"},
		{"BadFlag", name, "?command=true&stdout=maybe", nil, nil, 400, "Stoke.InvalidArgument"},
		{"UnknownParameter", name, "?command=true&stdout=true&shell=1", nil, nil, 400, "Stoke.InvalidArgument"},
		{"AttachWithCommand", name, "?attach=true&command=true&stdout=true", nil, nil, 400, "Stoke.InvalidArgument"},
		{"StdinOnceWithoutAttach", name, "?command=true&stdout=true&stdinOnce=true", nil, nil, 400, "Stoke.InvalidArgument"},
		// Its task was started without stdin or a terminal.
		{"AttachToAPlainTask", name, "?attach=true&stdout=true", nil, nil, 409, "Stoke.FailedPrecondition"},
		{"WrongSubprotocol", name, ok, nil, []string{"v4.channel.k8s.io"}, 400, "Stoke.InvalidArgument"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Authorization": {"Bearer " + token}}
			for k, v := range tc.hdr {
				h.Del(k)
				for _, s := range v {
					h.Add(k, s)
				}
			}
			protocols := tc.protocols
			if protocols == nil {
				protocols = []string{channel.Protocol}
			}
			d := websocket.Dialer{Subprotocols: protocols}
			conn, resp, err := d.Dial(ws+"/v1/namespaces/default/runs/"+tc.path+"/exec"+tc.query, h)
			if err == nil {
				conn.Close()
				t.Fatal("upgraded")
			}
			if resp == nil {
				t.Fatalf("no answer: %v", err)
			}
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			wantError(t, reply{resp.StatusCode, resp.Header, body.Bytes()}, tc.status, tc.errorType, false)
		})
	}
	// A plain GET is told to upgrade.
	wantError(t, do(t, "GET", base+"/v1/namespaces/default/runs/"+name+"/exec"+ok, "", nil), 400, "Stoke.InvalidArgument", false)

	// The Run is untouched and a session still works.
	out, _, exit, err := exectest.Collect(context.Background(), execClient(t, base).Exec(), exec.Request{RunUID: run.UID, Command: []string{"echo", "fine"}}, nil)
	if err != nil || exit.Code != 0 || out != "fine\n" {
		t.Fatalf("after the refusals: %q %+v %v", out, exit, err)
	}
	if r, _ := plane.CachedRun("default", name); r.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("the run is %s", r.Status.Phase)
	}
	// The session's handler ends just after its client saw the status.
	deadline := time.Now().Add(exectest.Timeout)
	m := do(t, "GET", base+"/metrics", "", nil)
	for !strings.Contains(string(m.body), "stoke_exec_sessions_open 0") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		m = do(t, "GET", base+"/metrics", "", nil)
	}
	for _, want := range []string{`stoke_exec_sessions_started_total{code="101"} 1`, `stoke_exec_sessions_started_total{code="404"} 1`,
		`stoke_exec_sessions_started_total{code="409"} 2`, `stoke_exec_bytes_total{direction="out"} 5`, "stoke_exec_sessions_open 0"} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
