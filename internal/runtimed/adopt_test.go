package runtimed_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store/sqlite"
)

// A runtimed that restarts while its pod's Runtime Server lives on takes
// over what the previous one claimed: a running task is waited for (not
// started again) and records its result; a Ready function is served again
// with the registration the Runtime Server holds; a task the Runtime
// Server no longer knows fails as ExecutionLost.
func TestAdoptAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "runs"), filepath.Join(dir, "rs.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	listening := make(chan net.Addr, 1)
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- server.Run(ctx, server.Config{Runtime: "bash", Listen: "unix:" + sock, WorkspaceRoot: ws,
			StateDir: filepath.Join(dir, "state"), ShutdownGrace: time.Second, Logger: log,
			OnListen: func(a net.Addr) { listening <- a }})
	}()
	select {
	case <-listening:
	case err := <-srvErr:
		t.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pod := podsource.Pod{Namespace: "default", Runtime: "bash", Name: "bash-abcde", UID: "pod-uid-1", Addr: "unix://" + sock, WorkspaceRoot: ws}
	e := &env{t: t, runs: st.Runs(), pod: pod}
	inf := informer.New(st.Runs(), informer.Options{AssignedPodUID: pod.UID})
	infDone := make(chan struct{})
	go func() {
		defer close(infDone)
		_ = inf.Run(ctx)
	}()
	defer func() {
		cancel()
		<-infDone
		if err := <-srvErr; err != nil {
			t.Errorf("runtime server: %v", err)
		}
	}()
	start := func() (*runtimed.Started, func()) {
		d := runtimed.Start(ctx, runtimed.Config{Pod: pod, Runs: st.Runs(), Conn: conn, Logger: log, StatusPoll: 50 * time.Millisecond})
		return d, inf.AddEventHandler(d.Handler())
	}

	first, removeFirst := start()
	gofile := filepath.Join(dir, "go")
	task := e.submit(taskRun("task", fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.05; done; echo "DONE=$1" >> "$STOKE_OUTPUTS"; echo started >> %q`, gofile, filepath.Join(dir, "starts"))))
	e.waitPhase("task", v1alpha1.PhaseRunning)
	fn := e.submit(functionRun("fn", `handle() { printf '{"got":%s}' "$1"; }`, 0))
	e.waitPhase("fn", v1alpha1.PhaseReady)
	lost := e.submit(taskRun("lost", "sleep 100000"))
	e.waitPhase("lost", v1alpha1.PhaseRunning)

	// Running is recorded before the execution starts: wait until the
	// Runtime Server has both (its state has no event to await).
	rt := pb.NewRuntimeClient(conn)
	taskID, lostID := runlog.ExecutionID(string(task.UID), 1), runlog.ExecutionID(string(lost.UID), 1)
	for _, id := range []string{taskID, lostID} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := rt.Status(ctx, &pb.StatusRequest{Id: id}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("execution %s never started", id)
			}
		}
	}

	// The old runtimed goes; the Runtime Server forgets one execution
	// (as if it had been collected) before the new one comes.
	removeFirst()
	first.Stop()
	if _, err := rt.Cancel(ctx, &pb.CancelRequest{Id: lostID}); err != nil {
		t.Fatalf("cancel %s: %v", lostID, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := rt.Forget(ctx, &pb.ForgetRequest{Id: lostID})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("forget %s: %v", lostID, err)
		}
		time.Sleep(10 * time.Millisecond) // until the cancelled execution is terminal (no event for it)
	}

	second, removeSecond := start()
	defer second.Stop()
	defer removeSecond()
	second.Adopt(inf.List(nil))

	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := e.waitPhase("task", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.Outputs["DONE"] != "a b" {
		t.Fatalf("adopted task: %+v", done.Status)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "starts")); err != nil || string(b) != "started\n" {
		t.Fatalf("the task ran %q times: %v", b, err)
	}
	// The adopted registration is runtimed's own state, set once the
	// Runtime Server answers the registration again: poll for it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := second.Proxy().InvokeFunction(ctx, &pb.InvokeFunctionRequest{
			Registration: &pb.FunctionRegistration{RunUid: string(fn.UID)}, Input: []byte(`[2]`)})
		if err == nil {
			if string(resp.GetOutput()) != `{"got":[2]}` {
				t.Fatalf("adopted function answered %q", resp.GetOutput())
			}
			break
		}
		// NotFound until the worker is adopted, FailedPrecondition while it
		// registers again.
		if c := errdefs.Code(err); (c != codes.NotFound && c != codes.FailedPrecondition) || time.Now().After(deadline) {
			t.Fatalf("adopted function: %v", err)
		}
	}
	if got, err := st.Runs().Get(ctx, "default", "fn"); err != nil || got.Status.Phase != v1alpha1.PhaseReady || got.Status.Attempt != 1 {
		t.Fatalf("adopted function: %+v %v", got, err)
	}
	if got := e.waitPhase("lost", v1alpha1.PhaseFailed); got.Status.Reason != "ExecutionLost" {
		t.Fatalf("forgotten task: %+v", got.Status)
	}
}
