package gateway_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
)

// refusingReplica answers every invocation with err, counting them.
type refusingReplica struct {
	pb.UnimplementedFunctionRuntimeServer
	err   error
	calls *atomic.Int32
}

func (r refusingReplica) InvokeFunction(context.Context, *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	r.calls.Add(1)
	return nil, r.err
}

// A replica that refuses an invocation before running it (errdefs.NotRun,
// as runtimed does when its Runtime Server lost the registration) does
// not fail the call: it goes to the other replica. A failure that may have run (an
// unmarked Unavailable: the pod died during the call) is the caller's,
// never sent again. Before NotRun, the refusal reached the caller.
func TestNotRunGoesToAnotherReplica(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refusal error
		sentOn  bool // the call goes on to the other replica
	}{
		{"NotRun", errdefs.NotRun(errdefs.Errorf(errdefs.ErrNotFound, "run lost-1: no function registration")), true},
		{"MayHaveRun", errdefs.Errorf(errdefs.ErrUnavailable, "the pod stopped answering"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replica := func(uid string) *v1alpha1.Run {
				return &v1alpha1.Run{
					ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fn-" + uid, UID: types.UID("uid-" + uid), ResourceVersion: "7",
						Labels: map[string]string{v1alpha1.LabelFunction: "fn"}},
					Spec:   v1alpha1.RunSpec{Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}}},
					Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseReady},
				}
			}
			var refused atomic.Int32
			f := gateway.NewFunctions(gateway.FunctionsConfig{
				Hop: func(run *v1alpha1.Run) (pb.FunctionRuntimeServer, error) {
					if run.Name == "fn-lost" {
						return refusingReplica{err: tc.refusal, calls: &refused}, nil
					}
					return echoReplica{}, nil
				},
				Function: func(k dispatch.Key) (dispatch.Settings, bool) { return dispatch.Settings{}, k.Name == "fn" },
			})
			// The lost replica is the idle one picked first (the most
			// recently idle).
			f.Handler().OnAdd(replica("live"))
			f.Handler().OnAdd(replica("lost"))
			for i := range 3 {
				resp, uid, err := f.InvokeFunction(t.Context(), "default", "fn", &pb.InvokeFunctionRequest{Input: []byte(`1`)})
				if !tc.sentOn {
					if i == 0 && !errors.Is(err, errdefs.ErrUnavailable) {
						t.Fatalf("a call that may have run: %v from %q, want its Unavailable", err, uid)
					}
					continue
				}
				if err != nil || uid != "uid-live" || string(resp.GetOutput()) != "1" {
					t.Fatalf("call %d: %q from %q, %v; want 1 from the live replica", i, resp.GetOutput(), uid, err)
				}
			}
			if refused.Load() == 0 {
				t.Error("the lost replica was never called")
			}
		})
	}
}
