package lambda_test

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// A registration of the same code that comes while the function of the
// last one is being deleted waits for the deletion and creates the function
// again: it must not find the doomed function Active and lose it a moment
// later (the contract suite's RegisterFencing lost it once under load,
// attempt 1 released and attempt 2 registered in between).
func TestRegisterWhileTheFunctionIsBeingDeleted(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sim := simulator(t, func(c *lambdasim.Config) {
		c.BeforeDelete = func(string) {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	})
	srv := newServer(t, sim, "python")
	rs := runtimetest.StartServer(t, runtimetest.Harness{
		Runtime:  "lambda",
		Fixtures: func(f runtimetest.Fixture) runtimetest.Source { return pythonFixtures[f] },
	}, func(c *server.Config) { serve(c, srv) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	r1 := rs.Register(t, runtimetest.Echo, "uid-deleted")
	unregistered := make(chan error, 1)
	go func() {
		_, err := rs.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: r1})
		unregistered <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the function of the unregistered attempt was never deleted")
	}

	// The deletion is held in flight: the next attempt of the same code
	// registers meanwhile.
	req := rs.RegisterRequest(t, runtimetest.Echo, "uid-deleted", 2)
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	resp, err := rs.Functions.RegisterFunction(short, req)
	cancelShort()
	if err != nil {
		t.Fatalf("register attempt 2 during the deletion: %v", err)
	}
	close(release)
	if err := <-unregistered; err != nil {
		t.Fatalf("unregister attempt 1: %v", err)
	}
	for err == nil && resp.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING {
		resp, err = rs.Functions.RegisterFunction(ctx, req)
	}
	if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("register attempt 2: %v %v", resp.GetState(), err)
	}
	out, err := rs.Invoke(ctx, resp.GetRegistration(), `{"still":"here"}`, 0)
	if err != nil || string(out.GetOutput()) != `{"still":"here"}` {
		t.Fatalf("invoke attempt 2 after attempt 1's function was deleted: %v %v", out, err)
	}
	if fns := sim.Functions(); len(fns) != 1 {
		t.Fatalf("functions %v, want attempt 2's", fns)
	}
}
