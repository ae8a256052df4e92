package runtimed

import (
	"context"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
)

func (d *Daemon) setActive(uid string, reg *pb.FunctionRegistration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reg == nil {
		delete(d.active, uid)
		return
	}
	d.active[uid] = reg
}

// Proxy returns the FunctionRuntime proxy hop of this pod: the gateway
// invokes a function by Run UID with an empty registration ID, and runtimed
// fills in the private active registration and calls its Runtime Server.
// It can be served over gRPC or called in-process.
func (d *Daemon) Proxy() pb.FunctionRuntimeServer { return &proxy{d: d} }

type proxy struct {
	pb.UnimplementedFunctionRuntimeServer
	d *Daemon
}

func (p *proxy) resolve(ref *pb.FunctionRegistration) (*pb.FunctionRegistration, error) {
	if ref.GetRunUid() == "" {
		return nil, errdefs.InvalidArgument("registration.run_uid", "must not be empty")
	}
	if ref.GetRegistrationId() != "" {
		return nil, errdefs.InvalidArgument("registration.registration_id", "must be empty at the runtimed proxy hop; runtimed supplies it")
	}
	p.d.mu.Lock()
	reg := p.d.active[ref.GetRunUid()]
	w := p.d.workers[ref.GetRunUid()]
	p.d.mu.Unlock()
	if reg != nil {
		return reg, nil
	}
	if w != nil && w.registering() {
		// The Run is this pod's and its function is (being) registered:
		// the caller may try again shortly. The Retry-After crosses the
		// hop (errdefs.ToGRPC) to the gateway's 503.
		return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"run %s: its function is not registered on pod %s yet (registering, or registering again)", ref.GetRunUid(), p.d.cfg.Pod.Name), registeringRetry)
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s: no active function registration on pod %s", ref.GetRunUid(), p.d.cfg.Pod.Name)
}

// registeringRetry is the Retry-After of an invocation of a function that
// is registering (the gateway's NotReadyRetry).
const registeringRetry = time.Second

// registering reports whether w holds a function Run that has not ended
// and is not going away, so that its registration is on its way.
func (w *worker) registering() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	run := w.latest
	return !w.deleted && run != nil && run.Spec.Mode.Function != nil && run.DeletionTimestamp == nil &&
		!run.Spec.CancelRequested && !run.Status.Phase.Terminal()
}

// InvokeFunction forwards one invocation; the Runtime Server's status
// (including FUNCTION_ERROR details) is returned unchanged.
func (p *proxy) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	reg, err := p.resolve(req.GetRegistration())
	if err != nil {
		return nil, err
	}
	fwd := &pb.InvokeFunctionRequest{
		Registration: reg, InvocationId: req.GetInvocationId(), Input: req.GetInput(),
		ContentType: req.GetContentType(), TimeoutMillis: req.GetTimeoutMillis(),
	}
	resp, err := p.d.functions.InvokeFunction(ctx, fwd)
	if err != nil {
		return nil, err
	}
	// The registration ID stays private to runtimed.
	resp.Registration = &pb.FunctionRegistration{RunUid: reg.GetRunUid()}
	return resp, nil
}

// FunctionStatus reads the active registration's status by Run UID.
func (p *proxy) FunctionStatus(ctx context.Context, req *pb.FunctionStatusRequest) (*pb.FunctionStatusResponse, error) {
	reg, err := p.resolve(req.GetRegistration())
	if err != nil {
		return nil, err
	}
	resp, err := p.d.functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil {
		return nil, err
	}
	resp.Registration = &pb.FunctionRegistration{RunUid: reg.GetRunUid()}
	return resp, nil
}

// RegisterFunction is runtimed's own business, never the gateway's.
func (p *proxy) RegisterFunction(context.Context, *pb.RegisterFunctionRequest) (*pb.RegisterFunctionResponse, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "registrations are managed by runtimed; create a function Run instead")
}

// UnregisterFunction is runtimed's own business, never the gateway's.
func (p *proxy) UnregisterFunction(context.Context, *pb.UnregisterFunctionRequest) (*pb.UnregisterFunctionResponse, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "registrations are managed by runtimed; cancel or delete the Run instead")
}
