package runtimed

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

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
func (d *Daemon) Proxy() pb.FunctionRuntimeServer { return d.proxy }

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
	// Both refusals are made before anything ran (errdefs.NotRun): a
	// Function's gateway sends the invocation to another replica.
	if w != nil && w.registering() {
		// The Run is this pod's and its function is (being) registered:
		// the caller may try again shortly. The Retry-After crosses the
		// hop (errdefs.ToGRPC) to the gateway's 503.
		return nil, errdefs.NotRun(errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"run %s: its function is not registered on pod %s yet (registering, or registering again)", ref.GetRunUid(), p.d.cfg.Pod.Name), registeringRetry))
	}
	return nil, errdefs.NotRun(errdefs.Errorf(errdefs.ErrNotFound, "run %s: no active function registration on pod %s", ref.GetRunUid(), p.d.cfg.Pod.Name))
}

// serverReadyWait bounds how long an invocation waits for the connection
// to the pod's Runtime Server to come up before it is refused.
const serverReadyWait = 200 * time.Millisecond

// serverReady reports whether the connection to the pod's Runtime Server
// is up, waiting for it at most serverReadyWait while it connects. An
// invocation is forwarded only over a connection that is up: over one
// that is down (the Runtime Server's container died and restarts, which
// took its registrations with it) a call fails without being sent, and
// the gateway could not tell that failure from one in flight (which may
// have run). A connection that goes down between this check and the send
// fails the call as in flight: the one window left.
func (p *proxy) serverReady(ctx context.Context) bool {
	c, ok := p.d.cfg.Conn.(interface {
		GetState() connectivity.State
		WaitForStateChange(context.Context, connectivity.State) bool
		Connect()
	})
	if !ok {
		return true // in-process (tests): no connection to lose
	}
	if c.GetState() == connectivity.Ready {
		// Every warm call: no timer context made for a wait not needed.
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, serverReadyWait)
	defer cancel()
	for {
		s := c.GetState()
		switch s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			c.Connect()
			return false
		case connectivity.Idle:
			c.Connect()
		}
		if !c.WaitForStateChange(ctx, s) {
			return false
		}
	}
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
	if !p.serverReady(ctx) {
		return nil, errdefs.NotRun(errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"run %s: the Runtime Server of pod %s is not answering (restarting?); the invocation was not sent", reg.GetRunUid(), p.d.cfg.Pod.Name), registeringRetry))
	}
	fwd := &pb.InvokeFunctionRequest{
		Registration: reg, InvocationId: req.GetInvocationId(), Input: req.GetInput(),
		ContentType: req.GetContentType(), TimeoutMillis: req.GetTimeoutMillis(),
	}
	resp, err := p.d.functions.InvokeFunction(ctx, fwd)
	if err != nil {
		if errdefs.Code(err) == codes.NotFound {
			// The Runtime Server has no registration for this Run (it
			// restarted, and runtimed has not registered it again yet):
			// refused before anything ran (seed 000: NotFound means no
			// registration has this Run UID).
			return nil, errdefs.NotRun(errdefs.FromGRPC(err))
		}
		return nil, err
	}
	// The registration ID stays private to runtimed: the answer names the
	// registration as the caller did, by Run UID alone (resolve refuses
	// any other reference).
	resp.Registration = req.GetRegistration()
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
