package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
	"stoke.dev/stoke/internal/runtime/runtimetest"
)

var execRuns atomic.Int64

// execTask starts a task that sleeps until cancelled, for exec sessions.
func execTask(t *testing.T, srv *runtimetest.Server) exectest.Run {
	t.Helper()
	dir := srv.Dir(t, runtimetest.Source{Files: map[string]string{"main.sh": "exec sleep 100000\n"}})
	uid := fmt.Sprintf("exec-task-%d", execRuns.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	if _, err := srv.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: uid, Entrypoint: "main.sh", WorkingDir: dir,
		Env: map[string]string{"RUN_VAR": "run-value"}}); err != nil {
		t.Fatal(err)
	}
	end := func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
		defer cancel()
		if _, err := srv.Runtime.Cancel(ctx, &pb.CancelRequest{Id: uid}); err != nil {
			t.Errorf("cancel %s: %v", uid, err)
		}
	}
	t.Cleanup(func() { end(t) })
	return exectest.Run{UID: uid, Dir: dir, Env: map[string]string{"RUN_VAR": "run-value"}, End: end}
}

// The suite against a real Runtime Server's Exec service over gRPC.
func TestExec(t *testing.T) {
	srv := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "bash"}, nil)
	exectest.Test(t, exectest.Harness{
		Executor:   exec.NewGRPCClient(srv.Conn),
		Task:       func(t *testing.T) exectest.Run { return execTask(t, srv) },
		Signals:    true,
		RequestEnv: true,
		Pids:       true,
		BigBytes:   32 << 20,
	})
}

// An exec into a Python function's registration sees its working directory
// and env, leaves a concurrent invocation alone, and ends when the
// registration is replaced.
func TestExecFunction(t *testing.T) {
	srv := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "python"}, nil)
	x := exec.NewGRPCClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	src := runtimetest.Source{Files: map[string]string{"handler.py": "import time\n\ndef handle(ms):\n    time.sleep(ms / 1000)\n    return ms\n"}, Handler: "handler.handle"}
	dir := srv.Dir(t, src)
	regReq := &pb.RegisterFunctionRequest{RunUid: "exec-fn", RegistrationAttempt: 1, WorkingDir: dir, Handler: src.Handler,
		Env: map[string]string{"FN_VAR": "fn-value"}, IdleTimeoutSeconds: 300, RegistrationDigest: runtimetest.Digest("a")}
	resp, err := srv.Functions.RegisterFunction(ctx, regReq)
	if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("register: %v %v", resp, err)
	}
	reg := resp.GetRegistration()

	out, _, exit, err := exectest.Collect(ctx, x, exec.Request{RunUID: "exec-fn", RegistrationID: reg.GetRegistrationId(),
		Command: []string{"bash", "-c", `pwd; printenv FN_VAR`}}, nil)
	if err != nil || exit.Code != 0 || out != dir+"\nfn-value\n" {
		t.Fatalf("exec: %q %+v %v; want %s and fn-value", out, exit, err, dir)
	}

	// A stale registration ID is refused.
	if _, _, _, err := exectest.Collect(ctx, x, exec.Request{RunUID: "exec-fn", RegistrationID: "reg_stale", Command: []string{"true"}}, nil); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Errorf("stale registration: %v, want NotRunning", err)
	}

	// A session open during an invocation changes nothing about it.
	marker := exectest.Marker()
	sess, err := x.Start(ctx, exec.Request{RunUID: "exec-fn", RegistrationID: reg.GetRegistrationId(), Command: []string{"sleep", marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	done := make(chan error, 1)
	go func() {
		_, err := sess.Stream(ctx, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
		done <- err
	}()
	inv, err := srv.Invoke(ctx, reg, "200", 0)
	if err != nil || string(inv.GetOutput()) != "200" {
		t.Fatalf("invoke during exec: %v %v", inv, err)
	}
	st, err := srv.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil || st.GetInFlight() != 0 || st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("status during exec: %v %v", st, err)
	}

	// Replacing the registration ends the session and its processes.
	regReq.RegistrationAttempt = 2
	if _, err := srv.Functions.RegisterFunction(ctx, regReq); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrNotRunning) {
			t.Errorf("session ended with %v, want NotRunning", err)
		}
	case <-time.After(exectest.Timeout):
		t.Fatal("the session outlived its registration")
	}
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
}
