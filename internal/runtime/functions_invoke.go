package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	goruntime "runtime"
	"strconv"
	"time"
	"unicode/utf8"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/randid"
)

// inflight is the invocation in flight on a registration.
type inflight struct {
	call *callCtx
	done chan struct{}
}

// drain cancels the invocation as release does.
func (fl *inflight) drain() { fl.call.drain() }

// errDrainCancelled is the cause of an invocation cancelled by
// UnregisterFunction or by supersession.
var errDrainCancelled = errdefs.Errorf(errdefs.ErrFailedPrecondition, "invocation cancelled: registration is being unregistered")

// InvokeFunction runs one bounded invocation; see the contract's
// "Invocation Semantics".
func (f *Functions) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	invID := req.GetInvocationId()
	if len(invID) > bounds.InvocationID {
		return nil, errdefs.InvalidArgument("invocation_id", "is %d bytes, at most %d allowed", len(invID), bounds.InvocationID)
	}
	if err := validateContentType(req.GetContentType()); err != nil {
		return nil, err
	}
	input := req.GetInput()
	if len(input) > bounds.InvokeBody {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "input: %d bytes, at most %d allowed", len(input), bounds.InvokeBody)
	}
	if !json.Valid(input) {
		return nil, errdefs.InvalidArgument("input", "is not valid JSON")
	}
	if !utf8.Valid(input) {
		// JSON text is UTF-8 (RFC 8259): refused here, before any adapter,
		// so that Bash (which would pass the bytes on) and Python (which
		// could not decode them) answer alike.
		return nil, errdefs.InvalidArgument("input", "is not valid UTF-8")
	}
	timeout, err := f.invokeTimeout(req.GetTimeoutMillis())
	if err != nil {
		return nil, err
	}
	r, err := f.lookup(req.GetRegistration())
	if err != nil {
		return nil, err
	}
	if invID == "" {
		invID = randid.New("inv_")
	}
	if state, _ := r.snapshot(); state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration is %s, not ready", r.uid, stateName(state))
	}
	if err := r.acquire(ctx); err != nil {
		return nil, err
	}
	invCtx := &r.call
	deadline := invCtx.begin(ctx, timeout)
	fl := &inflight{call: invCtx, done: make(chan struct{})}
	// The call's ends, last first, in one deferred function: with a defer
	// for each and this many returns, the compiler cannot open-code them
	// and every call went through the runtime's defer records.
	registered, scope := false, ""
	var fin Finisher // set once the instance's Invoke has returned
	defer func() {
		invCtx.finish()
		ends := func() {
			if fin != nil {
				fin.Finish()
			}
			if scope != "" {
				f.cfg.Scopes.End(scope)
			}
			if registered {
				r.lastActivity.Store(time.Now().UnixNano())
				r.mu.Lock()
				r.inflight = nil
				r.mu.Unlock()
			}
			close(fl.done)
		}
		if fin == nil && scope == "" {
			ends()
			r.busy.Store(false)
			return
		}
		// The rest of the call's ends (the kill of what it left running,
		// the end of its scope) run once the answer is on its way: the
		// goroutine is queued behind the gRPC writer that the answer
		// readies, and yields once more to let it write. The
		// registration stays busy until they are done; a call that
		// comes meanwhile waits for them (acquire).
		tail := make(chan struct{})
		r.tail.Store(&tail)
		go func() {
			goruntime.Gosched()
			ends()
			r.busy.Store(false)
			r.tail.Store(nil)
			close(tail)
		}()
	}()

	r.mu.Lock()
	if r.state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		state := r.state
		r.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration is %s, not ready", r.uid, stateName(state))
	}
	r.inflight = fl
	r.mu.Unlock()
	registered = true
	r.lastActivity.Store(time.Now().UnixNano())

	// A replaced instance may still be loading: wait within the timeout.
	var inst Instance
	for inst == nil {
		r.mu.Lock()
		var state pb.FunctionRegistrationState
		var ready chan struct{}
		inst, state, ready = r.inst, r.state, r.instReady
		if inst != nil && isClosed(inst.Done()) {
			// Died (e.g. killed after the previous call's timeout) and the
			// supervisor has not swapped it out yet: wait for the new one.
			r.retireLocked(inst)
			inst, ready = nil, r.instReady
		}
		r.mu.Unlock()
		if inst != nil {
			break
		}
		if state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration is %s, not ready", r.uid, stateName(state))
		}
		select {
		case <-ready:
		case <-invCtx.Done():
			return nil, f.invokeCtxErr(invCtx, r, invID, timeout)
		}
	}

	start := time.Now()
	call := Invocation{ID: invID, RunUID: r.uid, Input: input, Deadline: deadline}
	if sc := f.cfg.Scopes; sc != nil {
		call.Scope = r.id + "." + strconv.FormatUint(r.invocations.Add(1), 10)
		sc.Begin(call.Scope)
		scope = call.Scope
	}
	res, err := inst.Invoke(invCtx, call)
	fin, _ = inst.(Finisher)
	if err == nil && invCtx.Err() != nil {
		err = invCtx.Err()
	}
	if err != nil {
		if invCtx.Err() != nil {
			err = f.invokeCtxErr(invCtx, r, invID, timeout)
		}
		var fe *errdefs.FunctionError
		if errors.As(err, &fe) {
			fe.InvocationID = invID
		}
		r.log.Info("invocation failed", "invocation_id", invID, "duration", time.Since(start), "error", err)
		return nil, err
	}
	out, err := checkOutput(res, invID)
	if err != nil {
		r.log.Info("invocation failed", "invocation_id", invID, "duration", time.Since(start), "error", err)
		return nil, err
	}
	// No logger derived per call: With formats its attributes even when
	// nothing is logged.
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.LogAttrs(ctx, slog.LevelDebug, "invocation done", slog.String("invocation_id", invID), slog.Duration("duration", time.Since(start)))
	}
	return &pb.InvokeFunctionResponse{
		Registration: r.ref(),
		InvocationId: invID,
		Output:       out,
		ContentType:  "application/json",
		Outputs:      res.Outputs,
	}, nil
}

// acquire makes the registration busy with a call, or refuses it when
// another is in flight; it waits for the ends of one that has answered
// (InvokeFunction's tail), within ctx.
func (r *registration) acquire(ctx context.Context) error {
	for !r.busy.CompareAndSwap(false, true) {
		t := r.tail.Load()
		if t == nil {
			if r.busy.CompareAndSwap(false, true) {
				return nil // the tail ended between the two looks
			}
			return errdefs.Errorf(errdefs.ErrResourceExhausted, "run %s: an invocation is already in flight", r.uid)
		}
		select {
		case <-*t:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return errdefs.Errorf(errdefs.ErrDeadlineExceeded, "run %s: the call's deadline passed before it started", r.uid)
			}
			return errdefs.Errorf(errdefs.ErrCanceled, "run %s: cancelled by the caller before it started", r.uid)
		}
	}
	return nil
}

// invokeCtxErr explains why an invocation's context ended.
func (f *Functions) invokeCtxErr(invCtx *callCtx, r *registration, invID string, timeout time.Duration) error {
	err, drained := invCtx.ended()
	if drained { // not its own deadline first
		return fmt.Errorf("invocation %s: %w", invID, errDrainCancelled)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.Errorf(errdefs.ErrDeadlineExceeded, "run %s: invocation %s exceeded its timeout of %s", r.uid, invID, timeout)
	}
	return errdefs.Errorf(errdefs.ErrCanceled, "run %s: invocation %s cancelled by the caller", r.uid, invID)
}

func (f *Functions) invokeTimeout(ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, errdefs.InvalidArgument("timeout_millis", "must not be negative")
	case ms == 0:
		return f.cfg.DefaultInvokeTimeout, nil
	}
	d := time.Duration(ms) * time.Millisecond
	if d > f.cfg.MaxInvokeTimeout || d <= 0 { // <= 0: overflow
		d = f.cfg.MaxInvokeTimeout
	}
	return d, nil
}

func validateContentType(ct string) error {
	if ct == "" || ct == "application/json" {
		return nil // the usual two, without a parse that allocates
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return errdefs.InvalidArgument("content_type", "%q is not supported; use application/json", ct)
	}
	return nil
}

// checkOutput validates a handler's result: JSON (empty output means null),
// within the body bound, outputs within theirs.
func checkOutput(res Result, invID string) ([]byte, error) {
	out := res.Output
	if len(out) > bounds.InvokeBody {
		return nil, &errdefs.FunctionError{Type: errdefs.RuntimeOutputTooLarge, InvocationID: invID,
			Message: fmt.Sprintf("handler output exceeds %d bytes", bounds.InvokeBody)}
	}
	if len(bytes.TrimSpace(out)) == 0 {
		out = []byte("null")
	}
	if !json.Valid(out) {
		return nil, &errdefs.FunctionError{Type: errdefs.RuntimeInvalidOutput, InvocationID: invID,
			Message: "handler output is not valid JSON: " + bounds.Truncate(string(out), 256)}
	}
	if err := outputs.Validate(res.Outputs); err != nil {
		return nil, &errdefs.FunctionError{Type: errdefs.RuntimeInvalidOutputs, InvocationID: invID, Message: err.Error()}
	}
	return out, nil
}
