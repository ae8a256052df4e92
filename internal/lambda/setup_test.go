package lambda_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// holdCreate makes the simulator's CreateFunction hang until its caller
// goes away; held is closed when the first call is held.
func holdCreate(held chan struct{}) func(*lambdasim.Config) {
	var once sync.Once
	return func(c *lambdasim.Config) {
		c.BeforeCreate = func(ctx context.Context, _ string) *lambdasim.Refusal {
			once.Do(func() { close(held) })
			<-ctx.Done()
			return &lambdasim.Refusal{Status: http.StatusInternalServerError, Type: "ServiceException", Message: "held by the test"}
		}
	}
}

// Cancel of a task whose CreateFunction hangs ends the execution CANCELLED
// at once: the relay, stopped, closes its connection, which ends the
// Runtime Server's side of the task whatever AWS call it waits on, and
// exits without using the core's kill grace (10 s; the relay used to sit
// in it and die by SIGKILL, 137).
func TestCancelWhileCreateFunctionHangs(t *testing.T) {
	held := make(chan struct{})
	sim := simulator(t, holdCreate(held))
	rs := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "lambda"}, func(c *server.Config) { serve(c, newServer(t, sim, "bash")) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": "echo never\n"}})
	if _, err := rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-held", WorkingDir: dir, Entrypoint: "task.sh"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("CreateFunction was never called")
	}
	if _, err := rs.Runtime.Cancel(ctx, &pb.CancelRequest{Id: "task-held"}); err != nil {
		t.Fatal(err)
	}
	// The bound: the execution is over within 1 s of the cancel.
	bound, cancelBound := context.WithTimeout(ctx, time.Second)
	defer cancelBound()
	st, err := rs.Runtime.Wait(bound, &pb.StatusRequest{Id: "task-held"})
	if err != nil {
		t.Fatalf("wait after cancel: %v", err)
	}
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_CANCELLED || st.GetExitCode() != 143 {
		t.Fatalf("after cancel: %v exit %d (%s); want CANCELLED, exit 143 (SIGTERM)", st.GetState(), st.GetExitCode(), st.GetErrorMessage())
	}
	if fns := sim.Functions(); len(fns) != 0 {
		t.Fatalf("functions %v; want none", fns)
	}
}

// A task whose function Lambda refuses never ran: it ends FAILED with no
// exit code and backend_setup_failed (runtimed's BackendSetupFailed,
// retried by default), not with the relay's exit 1 as if the program had
// failed (NonZeroExit, not retried).
func TestTaskWhoseFunctionIsRefusedNeverRan(t *testing.T) {
	sim := simulator(t, func(c *lambdasim.Config) {
		c.BeforeCreate = func(context.Context, string) *lambdasim.Refusal {
			return &lambdasim.Refusal{Status: http.StatusForbidden, Type: "AccessDeniedException", Message: "not allowed here"}
		}
	})
	rs := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "lambda"}, func(c *server.Config) { serve(c, newServer(t, sim, "bash")) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": "echo never\n"}})
	if _, err := rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-refused", WorkingDir: dir, Entrypoint: "task.sh"}); err != nil {
		t.Fatal(err)
	}
	st, err := rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: "task-refused"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_FAILED || st.GetExitCode() != -1 || !st.GetBackendSetupFailed() ||
		!strings.Contains(st.GetErrorMessage(), "AccessDeniedException") || !strings.Contains(st.GetErrorMessage(), "not allowed here") {
		t.Fatalf("task = %v exit %d backend_setup_failed %v (%s); want FAILED, -1, true, with AWS's refusal",
			st.GetState(), st.GetExitCode(), st.GetBackendSetupFailed(), st.GetErrorMessage())
	}
}
