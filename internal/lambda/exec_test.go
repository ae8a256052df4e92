package lambda_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// startTask starts a task on e that runs script with env, and waits until
// its process runs in the sandbox (found by the marker in env).
func startTask(t *testing.T, e env, id, script string, timeoutSecs int64) (dir, mark string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	mark = fmt.Sprintf("TASK_MARK=%d", time.Now().UnixNano())
	k, v, _ := strings.Cut(mark, "=")
	dir = e.rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": script}})
	if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: id, WorkingDir: dir, Entrypoint: "task.sh",
		Env: map[string]string{k: v}, TimeoutSeconds: timeoutSecs}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.rs.Runtime.Cancel(context.Background(), &pb.CancelRequest{Id: id})
	})
	return dir, mark
}

// An exec into a task on Lambda runs in the task's sandbox, in its
// working directory and env, never on the Runtime Server's machine
// (which ran it in the Run's local working directory before the agent).
func TestExecRunsInTheLambdaSandbox(t *testing.T) {
	e := start(t, "bash", bashTasks)
	dir, mark := startTask(t, e, "task-exec", "sleep 60\n", 60)
	x := exec.NewGRPCClient(e.rs.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out, errOut, exit, err := exectest.Collect(ctx, x, exec.Request{RunUID: "task-exec",
		Command: []string{"sh", "-c", `echo "fn=$AWS_LAMBDA_FUNCTION_NAME"; echo "root=$LAMBDA_TASK_ROOT"; pwd; echo "$TASK_MARK"`}}, nil)
	if err != nil || exit.Code != 0 {
		t.Fatalf("exec: %+v %v (%s)", exit, err, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	k, v, _ := strings.Cut(mark, "=")
	if len(lines) != 4 || lines[0] == "fn=" || lines[2] == dir || "root="+lines[2] != lines[1] || lines[3] != v {
		t.Fatalf("exec printed %q; want the sandbox's function name, its task root as working directory (not %s) and %s", out, dir, k)
	}
}

// The exec suite into a task on Lambda, through its reverse agent.
func TestExecSuiteOnLambda(t *testing.T) {
	e := start(t, "bash", bashTasks)
	n := 0
	exectest.Test(t, exectest.Harness{
		Executor: exec.NewGRPCClient(e.rs.Conn), Signals: true, RequestEnv: true, Pids: true,
		Task: func(t *testing.T) exectest.Run {
			n++
			id := fmt.Sprintf("task-suite-%d", n)
			_, mark := startTask(t, e, id, "sleep 600\n", 600)
			k, v, _ := strings.Cut(mark, "=")
			return exectest.Run{UID: id, Dir: sandboxRoot(t, e, id), Env: map[string]string{k: v}, End: func(t *testing.T) {
				if _, err := e.rs.Runtime.Cancel(context.Background(), &pb.CancelRequest{Id: id}); err != nil {
					t.Fatal(err)
				}
			}}
		},
	})
}

// sandboxRoot is the task's working directory in its sandbox.
func sandboxRoot(t *testing.T, e env, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out, _, _, err := exectest.Collect(ctx, exec.NewGRPCClient(e.rs.Conn), exec.Request{RunUID: id, Command: []string{"pwd"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// Cancel of a task on Lambda kills its process in the sandbox (through the
// agent), long before its deadline would.
func TestCancelKillsTheTaskInTheSandbox(t *testing.T) {
	e := start(t, "bash", bashTasks)
	_, mark := startTask(t, e, "task-cancel", "sleep 600\n", 600)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The agent is connected once an exec works.
	if _, _, _, err := exectest.Collect(ctx, exec.NewGRPCClient(e.rs.Conn), exec.Request{RunUID: "task-cancel", Command: []string{"true"}}, nil); err != nil {
		t.Fatal(err)
	}
	awaitSandbox(t, mark, 1)
	start := time.Now()
	if _, err := e.rs.Runtime.Cancel(ctx, &pb.CancelRequest{Id: "task-cancel"}); err != nil {
		t.Fatal(err)
	}
	awaitSandbox(t, mark, 0)
	t.Logf("the task's sleep was gone from the sandbox %s after the cancel", time.Since(start))
	// The invocation ended with the bootstrap's answer, not the function's timeout.
	ended, err := e.sim.AwaitEnded(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ended[0].ErrorType != "" {
		t.Fatalf("the task's invocation ended with %s; want the bootstrap's answer", ended[0].ErrorType)
	}
}

// awaitSandbox polls /proc (the sandboxes' processes are this machine's,
// and no event tells) until n sleeps carry mark.
func awaitSandbox(t *testing.T, mark string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(lambdasim.Processes("sleep", mark)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("not %d sleeps with %s in the sandbox within 60 s", n, mark)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A task with an open exec session whose invocation reaches Lambda's
// deadline first (a task longer than Lambda allows: the server's largest
// task timeout, Lambda's 15 minutes, is 8 s here): the session gets the
// deadline notice 5 s before the invocation ends (from the deadline
// header the RIE gives the bootstrap), later execs are refused, and the
// task's end says what happened (lifetime_expired).
func TestDeadlineNoticeOnLambda(t *testing.T) {
	sim := simulator(t)
	srv := newServerWith(t, sim, "bash", func(c *lambda.Config) { c.TaskTimeout = 8 * time.Second })
	e := env{sim: sim, rs: runtimetest.StartServer(t, runtimetest.Harness{Runtime: "lambda",
		Fixtures: func(f runtimetest.Fixture) runtimetest.Source { return bashTasks[f] }}, func(c *server.Config) { serve(c, srv) })}
	startTask(t, e, "task-deadline", "sleep 600\n", 60)
	x := exec.NewGRPCClient(e.rs.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	sess, err := x.Start(ctx, exec.Request{RunUID: "task-deadline", Command: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	_, err = sess.Stream(ctx, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
	if !errors.Is(err, errdefs.ErrNotRunning) || !strings.Contains(err.Error(), "the Lambda invocation hosting this Run reaches its deadline") {
		t.Fatalf("the session ended with %v; want the deadline notice", err)
	}
	if _, err = x.Start(ctx, exec.Request{RunUID: "task-deadline", Command: []string{"true"}}); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("an exec after the notice: %v", err)
	}
	st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: "task-deadline"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() == pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || !strings.Contains(st.GetStderr()+st.GetErrorMessage(), "lifetime_expired") {
		t.Fatalf("task = %v exit %d stderr %q (%s); want its end to say lifetime_expired", st.GetState(), st.GetExitCode(), st.GetStderr(), st.GetErrorMessage())
	}
}

// A task that runs out of space (a real ENOSPC: /dev/full, as the
// simulator does not bound a sandbox's /tmp) fails with its own exit code
// and a message naming the cause and the ephemeral storage's size.
func TestNoSpaceIsNamed(t *testing.T) {
	e := start(t, "bash", bashTasks)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	dir := e.rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": "head -c 4096 /dev/zero > /dev/full || exit 7\n"}})
	if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-full", WorkingDir: dir, Entrypoint: "task.sh"}); err != nil {
		t.Fatal(err)
	}
	st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: "task-full"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetExitCode() != 7 || !strings.Contains(st.GetStderr(), "no space left in Lambda's ephemeral storage (") || !strings.Contains(st.GetStderr(), " MiB)") {
		t.Fatalf("task = %v exit %d stderr %q; want exit 7 and the cause named", st.GetState(), st.GetExitCode(), st.GetStderr())
	}
}

// Exec into a function Run on Lambda opens a sandbox of the function: the
// registration's package as working directory, its env, its handler's
// code; a second exec reuses the sandbox.
func TestExecIntoAFunctionOpensASandbox(t *testing.T) {
	e := start(t, "python", pythonFixtures)
	reg, st := register(t, e, runtimetest.Echo, "uid-fn-exec")
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("state %v, fatal_error %q", st.GetState(), st.GetFatalError())
	}
	x := exec.NewGRPCClient(e.rs.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req := exec.Request{RunUID: "uid-fn-exec", RegistrationID: reg.GetRegistrationId(),
		Command: []string{"sh", "-c", `pwd; echo "root=$LAMBDA_TASK_ROOT"; echo "fixture=$STOKE_FIXTURE"; echo "fn=$AWS_LAMBDA_FUNCTION_NAME"; ls`}}
	out, errOut, exit, err := exectest.Collect(ctx, x, req, nil)
	if err != nil || exit.Code != 0 {
		t.Fatalf("exec: %+v %v (%s)", exit, err, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 5 || "root="+lines[0] != lines[1] || lines[2] != "fixture="+string(runtimetest.Echo) || lines[3] == "fn=" ||
		!strings.Contains(out, "handler.py\n") {
		t.Fatalf("exec printed %q; want the function's package, env and code", out)
	}
	out, _, exit, err = exectest.Collect(ctx, x, exec.Request{RunUID: "uid-fn-exec", RegistrationID: reg.GetRegistrationId(), Command: []string{"echo", "again"}}, nil)
	if err != nil || exit.Code != 0 || out != "again\n" {
		t.Fatalf("a second exec: %q %+v %v", out, exit, err)
	}
}

// The status of a task on Lambda says whether its agent is connected
// (agent_connected, which runtimed puts on the Run for stoke describe):
// a Wait told what the caller saw answers when that changes, so the
// caller sees the agent connect while the task runs, and not connected
// once the task has ended. A Wait told nothing waits for the end, as the
// contract suite's does.
func TestStatusSaysWhetherTheAgentIsConnected(t *testing.T) {
	e := start(t, "bash", bashTasks)
	startTask(t, e, "task-agent", "sleep 600\n", 600)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	seen := []bool{false} // as runtimed starts: no agent seen
	for !seen[len(seen)-1] {
		st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: "task-agent", AgentConnectedSeen: &seen[len(seen)-1]})
		if err != nil {
			t.Fatal(err)
		}
		if st.AgentConnected == nil || st.GetState() != pb.ExecutionState_EXECUTION_STATE_RUNNING {
			t.Fatalf("Wait answered %v; want a running task with agent_connected", st)
		}
		seen = append(seen, st.GetAgentConnected())
	}
	t.Logf("Wait answered agent_connected %v", seen)
	if _, err := e.rs.Runtime.Cancel(ctx, &pb.CancelRequest{Id: "task-agent"}); err != nil {
		t.Fatal(err)
	}
	st, err := e.rs.Runtime.Status(ctx, &pb.StatusRequest{Id: "task-agent"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_CANCELLED || st.AgentConnected == nil || st.GetAgentConnected() {
		t.Fatalf("after the cancel: %v; want CANCELLED with agent_connected false", st)
	}
}
