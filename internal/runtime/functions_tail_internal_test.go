package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
)

// finishAdapter loads finishInstances.
type finishAdapter struct{ inst *finishInstance }

func (a finishAdapter) Name() string                 { return "finish" }
func (a finishAdapter) ValidateHandler(string) error { return nil }
func (a finishAdapter) Load(context.Context, FunctionSpec) (Instance, error) {
	return a.inst, nil
}
func (a finishAdapter) TaskCommand(string, []string, time.Duration) ([]string, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "no tasks")
}

// finishInstance echoes its input; its Finish says it began and waits
// until the test lets it end.
type finishInstance struct {
	mu       sync.Mutex
	events   []string
	finishes chan struct{} // a Finish began
	release  chan struct{} // lets one Finish end
	done     chan struct{}
}

func (i *finishInstance) record(e string) {
	i.mu.Lock()
	i.events = append(i.events, e)
	i.mu.Unlock()
}

func (i *finishInstance) Invoke(_ context.Context, inv Invocation) (Result, error) {
	i.record("invoke " + inv.ID)
	return Result{Output: inv.Input}, nil
}

func (i *finishInstance) Finish() {
	i.finishes <- struct{}{}
	<-i.release
	i.record("finish")
}

func (i *finishInstance) Done() <-chan struct{} { return i.done }
func (i *finishInstance) Close() error          { return nil }

// A Finisher's Finish runs after the call has answered, and before the
// next call on the registration, which waits for it rather than being
// refused as one in flight; meanwhile the registration reports the call
// in flight.
func TestFinishRunsAfterTheAnswerAndBeforeTheNextCall(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "fn"), 0o755); err != nil {
		t.Fatal(err)
	}
	ws, err := NewWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	inst := &finishInstance{finishes: make(chan struct{}, 2), release: make(chan struct{}), done: make(chan struct{})}
	f, err := NewFunctions(FunctionsConfig{Adapter: finishAdapter{inst}, Workspace: ws, ScratchRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Cleanup(func() { f.Close(0) })
	resp, err := f.RegisterFunction(ctx, &pb.RegisterFunctionRequest{RunUid: "fin", RegistrationAttempt: 1,
		WorkingDir: filepath.Join(root, "fn"), Handler: "h", IdleTimeoutSeconds: 300,
		RegistrationDigest: "sha256:" + strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	reg := resp.GetRegistration()
	for resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		st, err := f.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			break
		}
		time.Sleep(time.Millisecond) // polling the registration's state, which has no event to wait on
	}
	invoke := func(id string) (*pb.InvokeFunctionResponse, error) {
		return f.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg, InvocationId: id, Input: []byte(`1`)})
	}

	began := func() {
		t.Helper()
		select {
		case <-inst.finishes:
		case <-ctx.Done():
			t.Fatal("no Finish after the call")
		}
	}
	// The first call answers while its Finish has begun and not ended.
	if _, err := invoke("a"); err != nil {
		t.Fatal(err)
	}
	began()
	st, err := f.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil || st.GetInFlight() != 1 {
		t.Fatalf("status during the first call's Finish: %v, %v", st, err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := invoke("b")
		second <- err
	}()
	inst.release <- struct{}{} // the first Finish ends; the second call goes on
	if err := <-second; err != nil {
		t.Fatalf("the call after a finishing one: %v", err)
	}
	began()
	inst.release <- struct{}{}
	inst.mu.Lock()
	events := inst.events
	inst.mu.Unlock()
	if len(events) < 3 || events[0] != "invoke a" || events[1] != "finish" || events[2] != "invoke b" {
		t.Fatalf("events %q, want invoke a, finish, invoke b", events)
	}
}
