package runtimed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
)

// registerWait bounds one RegisterFunction call; past it the server answers
// REGISTERING and runtimed polls FunctionStatus.
const registerWait = 10 * time.Second

// registerLate is how many RegisterFunction calls in a row may end
// DeadlineExceeded before the registration counts as failed.
const registerLate = 3

// drainTimeout is how long an invocation in flight may finish when a
// function Run is cancelled, deleted or times out.
const drainTimeout = 10 * time.Second

// runFunction registers the function Run and keeps it until it ends. With
// claimed set, the claim (Scheduled → Running) is still on its way: it
// delivers the claimed Run, or nil when the claim was refused. With rc
// set too, the claim waits for the registration: a registration Ready
// before rc's bound takes it and writes it with Ready, else it is sent
// alone (readyClaim).
func (w *worker) runFunction(ctx context.Context, run *v1alpha1.Run, dir string, claimed <-chan *v1alpha1.Run, rc *readyClaim) {
	fn := run.Spec.Mode.Function
	// The claim, then the finalizer's write, go while the Runtime Server
	// registers (API round trips less before Ready: a scale from zero
	// waits for it); the Run is claimed and holds the finalizer before
	// anything is marked Ready or failed. A Run whose claim is refused,
	// or that goes away before it holds the finalizer, has its
	// registration, if any, ended here.
	if run.DeletionTimestamp != nil && !slices.Contains(run.Finalizers, Finalizer) {
		if rc != nil {
			rc.send()
		}
		if claimed != nil {
			<-claimed
		}
		return
	}
	held := make(chan *v1alpha1.Run, 1)
	hold := func(run *v1alpha1.Run) {
		go func() {
			if claimed != nil {
				if run = <-claimed; run == nil {
					held <- nil
					return
				}
			}
			if !slices.Contains(run.Finalizers, Finalizer) {
				run = w.addFinalizer(ctx, run)
			}
			held <- run
		}()
	}
	if rc == nil {
		hold(run)
	}

	regReq := &pb.RegisterFunctionRequest{
		RunUid: w.uid, RegistrationAttempt: max(run.Status.Attempt, 1), WorkingDir: dir,
		Handler: fn.Handler, Env: envMap(run), IdleTimeoutSeconds: fn.IdleTimeoutSeconds,
		RegistrationDigest: digest(run),
	}
	var resp *pb.RegisterFunctionResponse
	err := whileUnavailable(ctx, func() (err error) {
		for range registerLate {
			rctx, cancel := context.WithTimeout(ctx, registerWait)
			resp, err = w.d.functions.RegisterFunction(rctx, regReq)
			cancel()
			// The server answers REGISTERING before the deadline; an
			// answer that came too late anyway (a loaded machine) leaves
			// the registration loading, and the same attempt again is
			// idempotent (the contract): ask again, a few times, rather
			// than fail a Run whose handler may be loading fine.
			if status.Code(err) != codes.DeadlineExceeded || ctx.Err() != nil {
				return err
			}
			w.log.Warn("register: no answer within the call's deadline; asking again", "attempt", regReq.GetRegistrationAttempt())
		}
		return err
	})
	// A registration Ready within the bound goes with the claim: one
	// write, Scheduled → Ready.
	registeredReady := err == nil && resp.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY
	if registeredReady {
		w.registered = w.d.cfg.Now()
	}
	claimedReady := false
	if rc != nil {
		if registeredReady && rc.take() {
			claimedReady = true
			// The hop takes invocations before the write goes: the
			// gateway's watch may deliver Ready before it returns here.
			// Nothing routes to a Run that is not Ready.
			w.d.setActive(w.uid, resp.GetRegistration())
			held <- w.claimReady(ctx, rc.now)
		} else {
			rc.send()
			hold(run)
		}
	}
	if run = <-held; run == nil {
		if err == nil {
			w.d.setActive(w.uid, nil)
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout+5*time.Second)
			_, _ = w.d.functions.UnregisterFunction(uctx, &pb.UnregisterFunctionRequest{Registration: resp.GetRegistration(), CancelInFlight: true})
			cancel()
		}
		return
	}
	defer w.removeFinalizer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		switch status.Code(err) {
		case codes.Unimplemented:
			w.fail(ctx, retry.IncompatibleRuntime, "the runtime server does not implement executor.v1.FunctionRuntime; function Runs cannot fall back to one-shot execution")
		case codes.InvalidArgument:
			w.fail(ctx, retry.InvalidSpec, status.Convert(err).Message())
		default:
			w.fail(ctx, retry.RegistrationFailed, "register: "+status.Convert(err).Message())
		}
		return
	}
	if !w.adopted {
		w.d.cfg.Metrics.dispatched(modeFunction, w.d.cfg.Now().Sub(w.taken))
	}
	reg := resp.GetRegistration()
	w.d.setActive(w.uid, reg)
	defer w.d.setActive(w.uid, nil)
	unregister := func(cancelInFlight bool) {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout+5*time.Second)
		defer cancel()
		w.d.setActive(w.uid, nil)
		_, err := w.d.functions.UnregisterFunction(uctx, &pb.UnregisterFunctionRequest{
			Registration: reg, CancelInFlight: cancelInFlight, DrainTimeoutMillis: drainTimeout.Milliseconds()})
		if err != nil && ctx.Err() == nil {
			w.log.Warn("unregister", "error", err)
		}
	}

	lifetime := w.d.cfg.DefaultFunctionTimeout
	if run.Spec.Timeout != nil && run.Spec.Timeout.Duration > 0 {
		lifetime = run.Spec.Timeout.Duration
	}
	start := w.d.cfg.Now()
	if run.Status.StartTime != nil {
		start = run.Status.StartTime.Time
	}
	idle := time.Duration(fn.IdleTimeoutSeconds) * time.Second
	// An adopted function that was Ready is Ready already.
	marked := (w.adopted && run.Status.Phase == v1alpha1.PhaseReady) || claimedReady
	ready := resp.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY
	if ready && !marked {
		if !w.markReady(ctx) {
			unregister(true)
			return
		}
	}
	ticker := time.NewTicker(w.d.cfg.StatusPoll)
	defer ticker.Stop()
	for {
		if cancelReq, deleted := w.stopRequested(); cancelReq || deleted {
			if deleted {
				w.markTerminating(ctx)
			}
			unregister(false)
			if !deleted {
				w.finish(ctx, v1alpha1.PhaseCancelled, string(retry.Cancelled), "cancelled", nil)
			}
			return
		}
		now := w.d.cfg.Now()
		if lifetime > 0 && now.Sub(start) >= lifetime {
			unregister(false)
			w.finish(ctx, v1alpha1.PhaseTimeout, string(retry.Timeout), fmt.Sprintf("function reservation ended after %s", lifetime), nil)
			return
		}
		st, err := w.d.functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && (status.Code(err) == codes.NotFound || status.Code(err) == codes.FailedPrecondition):
			w.fail(ctx, retry.ExecutionLost, "registration lost: "+status.Convert(err).Message())
			return
		case err != nil:
			// The pod may be going away; the reaper acts on a pod that is
			// gone. A transient error is retried on the next tick.
			w.log.Debug("function status", "error", err)
		case st.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED:
			unregister(true)
			w.fail(ctx, retry.RegistrationFailed, st.GetFatalError())
			return
		case st.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY:
			if !ready {
				ready = true
				w.registered = w.d.cfg.Now()
				if !marked && !w.markReady(ctx) {
					unregister(true)
					return
				}
			}
			if idle > 0 && st.GetInFlight() == 0 && now.Sub(time.Unix(0, st.GetLastActivityUnixNano())) >= idle {
				unregister(false)
				w.finish(ctx, v1alpha1.PhaseTimeout, string(retry.IdleTimeout), fmt.Sprintf("no invocation for %s", idle), nil)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-w.updates:
		}
	}
}

// markReady records phase Ready with the endpoint; false if the Run moved
// on meanwhile.
func (w *worker) markReady(ctx context.Context) bool {
	now := metav1.NewTime(w.d.cfg.Now())
	updated, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		if r.Status.Phase != v1alpha1.PhaseRunning {
			return false
		}
		w.setReady(r, now)
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("marking ready", "error", err)
	}
	if updated != nil {
		w.logReady(updated, now.Time, false)
	}
	return updated != nil
}

// logReady says the Run is Ready, and when each step of its way here
// ended on this runtimed's clock (the scale from zero benchmark reads
// them): took is when the Run reached this runtimed (its Run watch),
// registered when the registration was known Ready, and wrote when the
// write that made it Ready began (oneWrite: with the claim).
func (w *worker) logReady(run *v1alpha1.Run, wrote time.Time, oneWrite bool) {
	w.log.Info("function ready", "endpoint", run.Status.Endpoint,
		"took", w.taken, "registered", w.registered, "wrote", wrote, "with_claim", oneWrite)
}

// setReady makes r's status Ready, with the endpoint.
func (w *worker) setReady(r *v1alpha1.Run, now metav1.Time) {
	r.Status.Phase = v1alpha1.PhaseReady
	r.Status.Endpoint = w.d.cfg.Endpoint(r)
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
		Type: "Ready", Status: metav1.ConditionTrue, Reason: "Registered",
		ObservedGeneration: r.Generation, LastTransitionTime: now,
	})
}

// TerminatingReason is the reason (of status.reason and of the Ready
// condition, False) of a function Run being deleted: finalizers may hold
// it for long, and it no longer takes invocations.
const TerminatingReason = "Terminating"

// markTerminating records that the Run is being deleted, unless it is
// gone already: a client's finalizer may hold it long after runtimed let
// its registration go, and it must not show Ready meanwhile.
func (w *worker) markTerminating(ctx context.Context) {
	if _, gone := w.current(); gone {
		return
	}
	now := metav1.NewTime(w.d.cfg.Now())
	_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		if r.DeletionTimestamp == nil || r.Status.Reason == TerminatingReason {
			return false
		}
		r.Status.Reason = TerminatingReason
		r.Status.Message = "the Run is being deleted: it takes no more invocations"
		meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
			Type: "Ready", Status: metav1.ConditionFalse, Reason: TerminatingReason, Message: r.Status.Message,
			ObservedGeneration: r.Generation, LastTransitionTime: now,
		})
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("marking terminating", "error", err)
	}
}

// addFinalizer makes a delete wait for runtimed's clean-up; it returns the
// updated Run, or nil when the Run is gone or being deleted.
func (w *worker) addFinalizer(ctx context.Context, run *v1alpha1.Run) *v1alpha1.Run {
	var updated *v1alpha1.Run
	_ = w.whileStoreUnavailable(ctx, ctx, "runs", func(ctx context.Context) error {
		return store.RetryOnConflict(func() error {
			if run.DeletionTimestamp != nil {
				return nil
			}
			r := run.DeepCopy()
			r.Finalizers = append(r.Finalizers, Finalizer)
			u, err := w.d.cfg.Runs.Update(ctx, r)
			if err == nil {
				w.wrote(run, u)
				updated = u
				return nil
			}
			if storeDown(err) {
				return err
			}
			fresh, gerr := w.d.cfg.Runs.Get(ctx, run.Namespace, run.Name)
			if storeDown(gerr) {
				return gerr
			}
			if errors.Is(gerr, errdefs.ErrNotFound) {
				return w.goneOrWait(gerr)
			}
			if gerr != nil || string(fresh.UID) != w.uid {
				return nil
			}
			run = fresh
			return err
		})
	})
	return updated
}

// removeFinalizer lets a deleted (or finished) function Run go. Its calls
// outlive ctx; while the store is unreachable it tries again until ctx
// ends (the daemon stops).
func (w *worker) removeFinalizer(ctx context.Context) {
	run, _ := w.current()
	_ = w.whileStoreUnavailable(ctx, context.WithoutCancel(ctx), "runs", func(ctx context.Context) error {
		return store.RetryOnConflict(func() error {
			fresh, err := w.d.cfg.Runs.Get(ctx, run.Namespace, run.Name)
			if err != nil {
				if errors.Is(err, errdefs.ErrNotFound) {
					return w.goneOrWait(err)
				}
				return err
			}
			if string(fresh.UID) != w.uid || !slices.Contains(fresh.Finalizers, Finalizer) {
				return nil
			}
			if uid := fresh.Status.AssignedPodUID; uid != "" && uid != w.d.cfg.Pod.UID {
				// Retried on another pod, whose runtimed now holds the
				// finalizer (and in Kubernetes only it may remove it).
				return nil
			}
			fresh.Finalizers = slices.DeleteFunc(fresh.Finalizers, func(f string) bool { return f == Finalizer })
			_, err = w.d.cfg.Runs.Update(ctx, fresh)
			return err
		})
	})
}
