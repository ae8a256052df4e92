package gateway_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
)

type echoReplica struct {
	pb.UnimplementedFunctionRuntimeServer
}

func (echoReplica) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	return &pb.InvokeFunctionResponse{Output: req.GetInput()}, nil
}

// A Function's URL called before the gateway's memory knows the Function
// (just after its create): the miss asks Fetch (the store, then the
// informers' catching up, which this Fetch stands in for by handing the
// Function and its replica over as the informers would), and the call
// goes to the replica; a Function the store does not have stays 404.
// Before Fetch, the first call was a 404.
func TestFunctionURLFetchesOnAMiss(t *testing.T) {
	replica := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fn-abcde", UID: "replica-1", ResourceVersion: "7",
			Labels: map[string]string{v1alpha1.LabelFunction: "fn"}},
		Spec:   v1alpha1.RunSpec{Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}}},
		Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseReady},
	}
	var known atomic.Bool
	var fetches atomic.Int32
	var f *gateway.Functions
	f = gateway.NewFunctions(gateway.FunctionsConfig{
		Hop: func(*v1alpha1.Run) (pb.FunctionRuntimeServer, error) { return echoReplica{}, nil },
		Function: func(k dispatch.Key) (dispatch.Settings, bool) {
			return dispatch.Settings{}, known.Load() && k.Name == "fn"
		},
		Fetch: func(_ context.Context, k dispatch.Key) error {
			fetches.Add(1)
			if k.Name != "fn" {
				return errdefs.Errorf(errdefs.ErrNotFound, "function %s not found", k)
			}
			known.Store(true)
			f.Handler().OnAdd(replica)
			return nil
		},
	})
	resp, uid, err := f.InvokeFunction(t.Context(), "default", "fn", &pb.InvokeFunctionRequest{Input: []byte(`1`)})
	if err != nil || uid != "replica-1" || string(resp.GetOutput()) != "1" {
		t.Fatalf("the first call of a just-created Function: %q from %q, %v; want 1 from replica-1", resp.GetOutput(), uid, err)
	}
	if _, _, err := f.InvokeFunction(t.Context(), "default", "fn", &pb.InvokeFunctionRequest{Input: []byte(`2`)}); err != nil {
		t.Fatalf("the second call: %v", err)
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("%d Fetches, want 1: a known Function asks nothing", n)
	}
	if _, _, err := f.InvokeFunction(t.Context(), "default", "nobody", &pb.InvokeFunctionRequest{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a Function nobody made: %v, want NotFound", err)
	}
}
