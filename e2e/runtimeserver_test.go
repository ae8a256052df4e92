package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "stoke.dev/stoke/api/executor/v1"
)

// runtimeServer is a running `stoke runtime-server` process.
type runtimeServer struct {
	addr      string
	workspace string
	// gomaxprocs is what the server's "listening" line says it runs with.
	gomaxprocs int
	cmd        *exec.Cmd
	exited     chan error
}

// startRuntimeServer runs the binary on a free loopback port and waits for
// its "listening" log line.
func startRuntimeServer(t *testing.T, runtime string, adjust ...func(*exec.Cmd)) *runtimeServer {
	t.Helper()
	ws := t.TempDir()
	cmd := exec.Command(stokeBin, "runtime-server", "--runtime", runtime,
		"--listen", "127.0.0.1:0", "--workspace-root", ws, "--shutdown-grace", "5s")
	for _, f := range adjust {
		f(cmd)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &runtimeServer{workspace: ws, cmd: cmd, exited: make(chan error, 1)}
	type listening struct {
		Msg        string `json:"msg"`
		Addr       string `json:"addr"`
		GOMAXPROCS int    `json:"gomaxprocs"`
	}
	addrc := make(chan listening, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line listening
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "runtime server listening" {
				addrc <- line
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.exited <- cmd.Wait()
	}()
	select {
	case line := <-addrc:
		s.addr, s.gomaxprocs = line.Addr, line.GOMAXPROCS
	case err := <-s.exited:
		t.Fatalf("runtime server exited before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("runtime server did not log its address")
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
	})
	return s
}

// terminate sends the server SIGTERM.
func (s *runtimeServer) terminate(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// awaitCleanExit waits for the server to exit with status 0.
func (s *runtimeServer) awaitCleanExit(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}

// grpcurl runs the pinned grpcurl with a JSON body, returning its output.
func (s *runtimeServer) grpcurl(t *testing.T, body, method string) (string, error) {
	t.Helper()
	cmd := exec.Command(grpcurlBin, "-plaintext", "-d", body, s.addr, method)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The seed's three example calls, verbatim but for real values in place of
// the elisions, against a real `stoke runtime-server`.
func TestSeedExamplesWithGrpcurl(t *testing.T) {
	for _, tc := range []struct{ runtime, file, source string }{
		{"bash", "handler.sh", "handle() { printf '{\"ok\":true,\"input\":%s}' \"$1\"; }\n"},
		{"python", "handler.py", "def handle(event):\n    return {\"ok\": True, \"input\": event}\n"},
	} {
		t.Run(tc.runtime, func(t *testing.T) {
			s := startRuntimeServer(t, tc.runtime)
			dir := filepath.Join(s.workspace, "runs", "2b5d")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.source), 0o644); err != nil {
				t.Fatal(err)
			}
			const uid = "2b5d6f0e-8c1a-4a55-9a7e-3f1d2c4b5a69"
			digest := "sha256:" + strings.Repeat("ab", 32)

			// 1. RegisterFunction.
			out, err := s.grpcurl(t, fmt.Sprintf(`{
  "runUid": %q,
  "registrationAttempt": 1,
  "workingDir": %q,
  "handler": "handler.handle",
  "idleTimeoutSeconds": 300,
  "registrationDigest": %q
}`, uid, dir, digest), "executor.v1.FunctionRuntime/RegisterFunction")
			if err != nil {
				t.Fatalf("register: %v\n%s", err, out)
			}
			var reg struct {
				Registration struct {
					RunUID         string `json:"runUid"`
					RegistrationID string `json:"registrationId"`
				} `json:"registration"`
				State string `json:"state"`
			}
			if err := json.Unmarshal([]byte(out), &reg); err != nil {
				t.Fatalf("register output %q: %v", out, err)
			}
			if reg.State != "FUNCTION_REGISTRATION_STATE_READY" || reg.Registration.RunUID != uid || !strings.HasPrefix(reg.Registration.RegistrationID, "reg_") {
				t.Fatalf("register answered %s", out)
			}

			// 2. InvokeFunction with the seed's base64 input {"command":"status"}.
			invoke := fmt.Sprintf(`{
  "registration": {
    "runUid": %q,
    "registrationId": %q
  },
  "invocationId": "01J9Z3Q4X5R6S7T8V9W0XYZ123",
  "contentType": "application/json",
  "input": "eyJjb21tYW5kIjoic3RhdHVzIn0="
}`, uid, reg.Registration.RegistrationID)
			out, err = s.grpcurl(t, invoke, "executor.v1.FunctionRuntime/InvokeFunction")
			if err != nil {
				t.Fatalf("invoke: %v\n%s", err, out)
			}
			var inv struct {
				InvocationID string `json:"invocationId"`
				Output       []byte `json:"output"`
				ContentType  string `json:"contentType"`
			}
			if err := json.Unmarshal([]byte(out), &inv); err != nil {
				t.Fatalf("invoke output %q: %v", out, err)
			}
			var result struct {
				OK    bool            `json:"ok"`
				Input json.RawMessage `json:"input"`
			}
			if err := json.Unmarshal(inv.Output, &result); err != nil || !result.OK {
				t.Fatalf("function output %q: %v", inv.Output, err)
			}
			var input map[string]string
			if err := json.Unmarshal(result.Input, &input); err != nil || input["command"] != "status" {
				t.Fatalf("handler saw %s", result.Input)
			}
			if inv.InvocationID != "01J9Z3Q4X5R6S7T8V9W0XYZ123" || inv.ContentType != "application/json" {
				t.Fatalf("invoke answered %s", out)
			}

			// 3. Attempt 2 supersedes; the old registration ID is fenced.
			out, err = s.grpcurl(t, fmt.Sprintf(`{"runUid": %q, "registrationAttempt": 2, "workingDir": %q, "handler": "handler.handle", "idleTimeoutSeconds": 300, "registrationDigest": %q}`,
				uid, dir, digest), "executor.v1.FunctionRuntime/RegisterFunction")
			if err != nil || !strings.Contains(out, "FUNCTION_REGISTRATION_STATE_READY") || strings.Contains(out, reg.Registration.RegistrationID) {
				t.Fatalf("register attempt 2: %v\n%s", err, out)
			}
			out, err = s.grpcurl(t, invoke, "executor.v1.FunctionRuntime/InvokeFunction")
			if err == nil || !strings.Contains(out, "FailedPrecondition") {
				t.Fatalf("stale invoke: want FailedPrecondition, got %v\n%s", err, out)
			}
			out, err = s.grpcurl(t, fmt.Sprintf(`{"registration": {"runUid": %q, "registrationId": %q}, "cancelInFlight": true}`, uid, reg.Registration.RegistrationID),
				"executor.v1.FunctionRuntime/UnregisterFunction")
			if err == nil || !strings.Contains(out, "FailedPrecondition") {
				t.Fatalf("stale unregister: want FailedPrecondition, got %v\n%s", err, out)
			}

			// Health checking and reflection are served.
			cmd := exec.Command(grpcurlBin, "-plaintext", s.addr, "list")
			list, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(list, []byte("executor.v1.FunctionRuntime")) || !bytes.Contains(list, []byte("executor.v1.Runtime")) || !bytes.Contains(list, []byte("grpc.health.v1.Health")) {
				t.Fatalf("reflection list: %v\n%s", err, list)
			}
			out, err = s.grpcurl(t, `{"service":"executor.v1.FunctionRuntime"}`, "grpc.health.v1.Health/Check")
			if err != nil || !strings.Contains(out, "SERVING") {
				t.Fatalf("health: %v\n%s", err, out)
			}

			// SIGTERM: graceful stop, exit status 0.
			s.terminate(t)
			s.awaitCleanExit(t)
		})
	}
}

// SIGTERM stops accepting work, lets the invocation in flight finish within
// the grace, and exits 0.
func TestSIGTERMDrainsInFlightInvocation(t *testing.T) {
	s := startRuntimeServer(t, "bash")
	dir := filepath.Join(s.workspace, "runs", "drain")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "slow.sh"), []byte(`handle() { sleep 1; printf '"done"'; }`), 0o644); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fns := pb.NewFunctionRuntimeClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := fns.RegisterFunction(ctx, &pb.RegisterFunctionRequest{RunUid: "drain", RegistrationAttempt: 1, WorkingDir: dir,
		Handler: "slow.handle", RegistrationDigest: "sha256:" + strings.Repeat("cd", 32)})
	if err != nil || reg.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("register: %v %v", reg, err)
	}
	type result struct {
		out *pb.InvokeFunctionResponse
		err error
	}
	invoked := make(chan result, 1)
	go func() {
		out, err := fns.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg.GetRegistration(), Input: []byte(`1`)})
		invoked <- result{out, err}
	}()
	for {
		st, err := fns.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg.GetRegistration()})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetInFlight() == 1 {
			break
		}
		time.Sleep(2 * time.Millisecond) // polling an observable state
	}
	s.terminate(t)
	if r := <-invoked; r.err != nil || string(r.out.GetOutput()) != `"done"` {
		t.Fatalf("in-flight invocation across SIGTERM: %v %v", r.out, r.err)
	}
	s.awaitCleanExit(t)
}

// A Runtime Server that leads its session, as a pod does, leaves nothing of
// it behind when it stops: not even a job a task put in a process group of
// its own, which the task's group kill cannot reach.
func TestStoppedServerLeavesNothingOfItsSession(t *testing.T) {
	s := startRuntimeServer(t, "bash", func(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} })
	dir := filepath.Join(s.workspace, "runs", "leftover")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "sleep.pid")
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// set -m gives the background sleep a process group of its own.
	if _, err := pb.NewRuntimeClient(conn).Execute(ctx, &pb.ExecuteRequest{Id: "leftover", WorkingDir: dir,
		Args: []string{"bash", "-c", "set -m; sleep 1000 & echo $! > sleep.pid.tmp && mv sleep.pid.tmp sleep.pid; wait"}}); err != nil {
		t.Fatal(err)
	}
	var pid int
	for deadline := time.Now().Add(20 * time.Second); ; {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the task never wrote its background job's pid")
		}
		time.Sleep(5 * time.Millisecond) // polling for a file the task writes
	}
	s.terminate(t)
	s.awaitCleanExit(t)
	// The server has exited, so its kill is done: the job must be dead
	// (a zombie waiting for init counts as dead).
	if p, alive := readProcess(pid); alive {
		t.Errorf("the task's background job outlived the server: %+v", p)
	}
}

// `stoke runtime-server` runs its Go code on one thread at a time unless
// GOMAXPROCS is set, which then applies as the Go runtime defines it.
func TestRuntimeServerGOMAXPROCS(t *testing.T) {
	env := func(extra ...string) func(*exec.Cmd) {
		return func(cmd *exec.Cmd) {
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "GOMAXPROCS=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, extra...)
		}
	}
	for _, c := range []struct {
		env  []string
		want int
	}{{nil, 1}, {[]string{"GOMAXPROCS=3"}, 3}} {
		s := startRuntimeServer(t, "python", env(c.env...))
		if s.gomaxprocs != c.want {
			t.Errorf("environment %q: the server runs with GOMAXPROCS %d, want %d", c.env, s.gomaxprocs, c.want)
		}
		s.terminate(t)
		s.awaitCleanExit(t)
	}
}
