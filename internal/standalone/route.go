package standalone

import (
	"context"

	"google.golang.org/grpc/codes"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
)

// routedHop is a Ready function's proxy hop as the gateway calls it. When
// the hop holds no registration of the Run — runtimed let it go because
// the Run is being deleted or cancelled, or lost it and registers it
// again — the answer says why from the Run's state now (gateway.Invocable,
// with a Retry-After when it may be Ready again), not the hop's 404 for a
// Run that exists.
type routedHop struct {
	pb.FunctionRuntimeServer
	s   *Standalone
	run *v1alpha1.Run
}

func (h *routedHop) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	resp, err := h.FunctionRuntimeServer.InvokeFunction(ctx, req)
	if err == nil || errdefs.Code(err) != codes.NotFound {
		return resp, err
	}
	run, ok := h.s.runInf.Get(h.run.Namespace, h.run.Name)
	if !ok || run.UID != h.run.UID {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s with uid %s not found", h.run.Namespace, h.run.Name, h.run.UID)
	}
	if why := gateway.Invocable(run); why != nil {
		return nil, why
	}
	return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
		"run %s/%s: its registration on pod %s is being replaced", run.Namespace, run.Name, run.Status.AssignedPod), gateway.NotReadyRetry)
}
