package gateway_test

import (
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

// A replica that leaves the Function after it was leased but before the
// call (its Run deleted between the dispatcher's choice and the hop) is
// not sent the invocation: the lease's call binds to nothing, and the
// invocation goes to the other replica. Before, the call went out on a
// context already ending and failed as "went away during the invocation
// (may have run)", though it never had.
func TestReplicaLeftBeforeTheCallIsNotSent(t *testing.T) {
	replica := func(uid string) *v1alpha1.Run {
		return &v1alpha1.Run{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fn-" + uid, UID: types.UID("uid-" + uid), ResourceVersion: "7",
				Labels: map[string]string{v1alpha1.LabelFunction: "fn"}},
			Spec:   v1alpha1.RunSpec{Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}}},
			Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseReady},
		}
	}
	leaving := replica("leaving")
	var sentToLeaving atomic.Int32
	var f *gateway.Functions
	f = gateway.NewFunctions(gateway.FunctionsConfig{
		Hop: func(run *v1alpha1.Run) (pb.FunctionRuntimeServer, error) {
			if run.Name == leaving.Name {
				// Its Run goes as the gateway reaches for its hop.
				f.Handler().OnDelete(leaving)
				return refusingReplica{err: errdefs.Errorf(errdefs.ErrInternal, "sent to a replica that left"), calls: &sentToLeaving}, nil
			}
			return echoReplica{}, nil
		},
		Function: func(k dispatch.Key) (dispatch.Settings, bool) { return dispatch.Settings{}, k.Name == "fn" },
	})
	// The leaving replica is the idle one picked first (the most
	// recently idle).
	f.Handler().OnAdd(replica("stays"))
	f.Handler().OnAdd(leaving)
	resp, uid, err := f.InvokeFunction(t.Context(), "default", "fn", &pb.InvokeFunctionRequest{Input: []byte(`1`)})
	if err != nil || uid != "uid-stays" || string(resp.GetOutput()) != "1" {
		t.Fatalf("%q from %q, %v; want 1 from the replica that stays", resp.GetOutput(), uid, err)
	}
	if n := sentToLeaving.Load(); n != 0 {
		t.Fatalf("the replica that left was sent %d invocations", n)
	}
	if ld := f.Dispatcher().Load(dispatch.Key{Namespace: "default", Name: "fn"}); ld.InFlight != 0 || ld.Replicas != 1 {
		t.Fatalf("load after: %+v", ld)
	}
}
