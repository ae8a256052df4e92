package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
)

// FunctionInvoker invokes a Function by name: its stable URL's route.
type FunctionInvoker interface {
	// InvokeFunction sends req, once, to one replica of the Function
	// namespace/name, waiting in the Function's queue for an idle one.
	// It returns the replica Run's UID with the answer (empty when no
	// replica was leased).
	InvokeFunction(ctx context.Context, namespace, name string, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, string, error)
}

// FunctionsConfig configures Functions.
type FunctionsConfig struct {
	// Dispatcher leases the replicas; nil is a new one on the real clock.
	Dispatcher *dispatch.Dispatcher
	// Hop is the mode's way to a Ready function Run's proxy hop (its
	// Router's, without the UID check).
	Hop func(run *v1alpha1.Run) (pb.FunctionRuntimeServer, error)
	// Function, when set, says whether the Function exists and what its
	// queue's settings are. A Function also exists while at least one Run
	// carries its label (with the default settings when Function says
	// nothing of it).
	Function func(key dispatch.Key) (dispatch.Settings, bool)
	// Synced says whether the Runs (and Functions) are known yet.
	Synced func() bool
	// Fetch, when set, is asked on a miss (neither Function nor a Run
	// says the Function exists): nil when the store has the Function and
	// the mode's informers have caught up with it (a Function created a
	// moment ago; informer.Informer.Fetch), NotFound when it has none.
	Fetch func(ctx context.Context, key dispatch.Key) error
}

// Functions is both modes' FunctionInvoker: it keeps each Function's
// replica Runs (the Runs labelled v1alpha1.LabelFunction, fed by the Run
// informer through Handler) in the dispatcher, and calls the leased
// replica's hop once.
type Functions struct {
	cfg FunctionsConfig
	d   *dispatch.Dispatcher

	mu sync.Mutex
	// replicas are each Function's replica Runs, by UID.
	replicas map[dispatch.Key]map[string]*v1alpha1.Run
}

var _ FunctionInvoker = (*Functions)(nil)

// NewFunctions returns a Functions; register its Handler on the Run
// informer.
func NewFunctions(cfg FunctionsConfig) *Functions {
	if cfg.Dispatcher == nil {
		cfg.Dispatcher = dispatch.New(dispatch.Config{})
	}
	return &Functions{cfg: cfg, d: cfg.Dispatcher, replicas: map[dispatch.Key]map[string]*v1alpha1.Run{}}
}

// Dispatcher is the dispatcher, for its loads (status, autoscaler).
func (f *Functions) Dispatcher() *dispatch.Dispatcher { return f.d }

// Handler keeps the replicas from the Run informer's events.
func (f *Functions) Handler() informer.Handler[*v1alpha1.Run] {
	return informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc: func(run *v1alpha1.Run) { f.put(run) },
		UpdateFunc: func(old, run *v1alpha1.Run) {
			// A relabelled Run leaves its old Function.
			if k, ok := functionOf(old); ok {
				if nk, _ := functionOf(run); nk != k {
					f.remove(k, old)
				}
			}
			f.put(run)
		},
		DeleteFunc: func(run *v1alpha1.Run) {
			if k, ok := functionOf(run); ok {
				f.remove(k, run)
			}
		},
	}
}

// functionOf is the Function a Run is a replica of.
func functionOf(run *v1alpha1.Run) (dispatch.Key, bool) {
	name := run.Labels[v1alpha1.LabelFunction]
	if name == "" || run.Spec.Mode.Function == nil {
		return dispatch.Key{}, false
	}
	return dispatch.Key{Namespace: run.Namespace, Name: name}, true
}

func (f *Functions) put(run *v1alpha1.Run) {
	k, ok := functionOf(run)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.replicas[k]
	if m == nil {
		m = map[string]*v1alpha1.Run{}
		f.replicas[k] = m
	}
	m[string(run.UID)] = run
	f.syncLocked(k, m)
}

func (f *Functions) remove(k dispatch.Key, run *v1alpha1.Run) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.replicas[k]
	delete(m, string(run.UID))
	if len(m) == 0 {
		delete(f.replicas, k)
	}
	f.syncLocked(k, m)
}

// syncLocked hands the Function's replicas to the dispatcher. A replica
// takes new invocations while its Run is Ready, not cancelled or being
// deleted (Invocable) and not draining.
func (f *Functions) syncLocked(k dispatch.Key, m map[string]*v1alpha1.Run) {
	list := make([]dispatch.Replica, 0, len(m))
	for uid, run := range m {
		takes := Invocable(run) == nil && run.Annotations[v1alpha1.AnnotationDraining] != "true"
		list = append(list, dispatch.Replica{ID: uid, Name: run.Name, Takes: takes, Version: run.ResourceVersion})
	}
	f.d.Sync(k, f.settings(k), list)
}

func (f *Functions) settings(k dispatch.Key) dispatch.Settings {
	if f.cfg.Function == nil {
		return dispatch.Settings{}
	}
	s, _ := f.cfg.Function(k)
	return s
}

// Resync hands a Function's replicas to the dispatcher again, with its
// settings as cfg.Function says now: call it when a Function changes.
func (f *Functions) Resync(k dispatch.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncLocked(k, f.replicas[k])
}

// exists says whether the Function exists: cfg.Function says so, or a
// Run carries its label (replicas made without a Function object).
func (f *Functions) exists(k dispatch.Key) bool {
	if f.cfg.Function != nil {
		if _, ok := f.cfg.Function(k); ok {
			return true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.replicas[k]) > 0
}

// fetch is a miss's second look: the store, through cfg.Fetch, and then
// the memory again (a Function being deleted is found there, and is not
// invocable).
func (f *Functions) fetch(ctx context.Context, k dispatch.Key) error {
	notFound := errdefs.Errorf(errdefs.ErrNotFound, "function %s not found", k)
	if f.cfg.Fetch == nil {
		return notFound
	}
	if err := f.cfg.Fetch(ctx, k); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return notFound
		}
		return fmt.Errorf("function %s: %w", k, err)
	}
	if !f.exists(k) {
		return notFound
	}
	return nil
}

// replica is the replica Run with this UID.
func (f *Functions) replica(k dispatch.Key, uid string) *v1alpha1.Run {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replicas[k][uid]
}

// InvokeFunction implements FunctionInvoker. The invocation goes to one
// replica once. Before it runs, three answers send it back to the front
// of the queue for another replica: the replica's hop is gone (its pod
// went before its Run says so), the replica refused it before running it
// (errdefs.NotRun: runtimed has no registration for it, or its Runtime
// Server is down), or the replica is busy (ResourceExhausted: with two
// gateways, the other holds it; seed 000's one invocation in flight per
// registration is the arbiter). Nothing is retried after dispatch.
func (f *Functions) InvokeFunction(ctx context.Context, namespace, name string, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, string, error) {
	k := dispatch.Key{Namespace: namespace, Name: name}
	if f.cfg.Synced != nil && !f.cfg.Synced() {
		return nil, "", errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "the gateway is starting; function %s is not routable yet", k), NotReadyRetry)
	}
	if !f.exists(k) {
		if err := f.fetch(ctx, k); err != nil {
			return nil, "", err
		}
	}
	timeout := time.Duration(req.GetTimeoutMillis()) * time.Millisecond
	lease, err := f.d.Acquire(ctx, k, timeout)
	for {
		if err != nil {
			return nil, "", err
		}
		uid := lease.Replica().ID
		run := f.replica(k, uid)
		var hop pb.FunctionRuntimeServer
		if run != nil {
			hop, err = f.cfg.Hop(run)
		}
		if run == nil || err != nil {
			// Not sent: its pod is gone before its Run says so. Another
			// replica, or wait for one.
			lease.Broken()
			lease, err = lease.Requeue(ctx, timeout)
			continue
		}
		var resp *pb.InvokeFunctionResponse
		var sent bool
		resp, sent, err = f.call(ctx, lease, hop, req, timeout)
		switch {
		case !sent || errdefs.WasNotRun(err):
			// Not sent (the replica left as it was leased), or refused
			// before it ran (errdefs.NotRun: the replica's
			// registration is gone or not there yet, or its pod's
			// Runtime Server is down): not dispatched, so another
			// replica, or wait for one; this one is left out until its
			// Run changes or a while has passed.
			lease.Broken()
			lease, err = lease.Requeue(ctx, timeout)
			continue
		case lease.Gone():
			lease.Release()
			err = errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
				"function %s: its replica %s went away during the invocation (the invocation may have run)", k, run.Name), NotReadyRetry)
		case errdefs.Code(err) == codes.ResourceExhausted:
			// Busy: refused before it ran.
			lease, err = lease.Busy(ctx, timeout)
			continue
		case errdefs.Code(err) == codes.Unavailable:
			// Its pod stopped answering (or it is not Ready now): this
			// call fails (it may have run), and the replica is left out
			// until its Run changes or a while has passed, so that the
			// calls after it go elsewhere.
			lease.Broken()
		default:
			lease.Release()
		}
		return resp, uid, err
	}
}

// call makes the one call to the leased replica, in a context that ends
// if the replica leaves meanwhile (dispatch.Lease.Bind); sent is false
// when it had left before the call. A wait in the queue counts against
// the invocation's timeout: the call gets what is left.
func (f *Functions) call(ctx context.Context, lease *dispatch.Lease, hop pb.FunctionRuntimeServer, req *pb.InvokeFunctionRequest, timeout time.Duration) (resp *pb.InvokeFunctionResponse, sent bool, err error) {
	if w := lease.Waited(); w > 0 {
		if timeout <= 0 {
			timeout = bounds.DefaultInvokeTimeout
		}
		req.TimeoutMillis = max(1, (timeout - w).Milliseconds())
	}
	ctx, cancel, ok := lease.Bind(ctx)
	if !ok {
		return nil, false, nil
	}
	defer cancel(nil)
	req.Registration = &pb.FunctionRegistration{RunUid: lease.Replica().ID}
	resp, err = hop.InvokeFunction(ctx, req)
	if err != nil {
		return nil, true, hopError(err, "function "+lease.Key().String())
	}
	return resp, true, nil
}
