package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/validation"
)

// FunctionsConfig configures a Functions table.
type FunctionsConfig struct {
	Adapter   Adapter
	Workspace *Workspace
	// ScratchRoot holds one private directory per registration.
	ScratchRoot string
	// IPCRoot, when set, holds the directory per registration in which the
	// adapter exchanges request files and FIFOs with its processes
	// (FunctionSpec.ScratchDir); otherwise that lies in ScratchRoot. A
	// memory file system there makes each warm Bash invocation cheaper.
	IPCRoot string
	Logger  *slog.Logger // events, never output
	// Logs, when set, receives the handlers' output, in the log of their
	// Run (runlog.Files.OpenRun).
	Logs *runlog.Files
	// DefaultInvokeTimeout applies when a request's timeout_millis is 0;
	// MaxInvokeTimeout clamps larger ones. InitTimeout bounds a Load.
	DefaultInvokeTimeout time.Duration
	MaxInvokeTimeout     time.Duration
	InitTimeout          time.Duration
	// BaseEnv, when set, is added to every handler's environment beneath
	// the registration's env, and is not counted against its bounds: the
	// Lambda bootstrap's AWS_* and LAMBDA_* variables.
	BaseEnv map[string]string
	// Scopes, when set, tracks each registration's and each invocation's
	// processes: what an invocation leaves running is killed when it
	// ends, what a registration started when it is released.
	Scopes Scopes
	// User, when set, is the unprivileged user the handlers run as (a
	// server running as root): each registration's working directory and
	// TMPDIR are handed to it, and ScratchRoot, IPCRoot and the
	// directories between them and what it is given are passages
	// (internal/runuser). Nil: as this process.
	User *runuser.User
}

// Functions is the FunctionRuntime implementation of one Runtime Server: the
// table of registrations by Run UID, each the current generation for its
// UID. It implements executorv1.FunctionRuntimeServer so that it can be
// served over gRPC or called in-process; its errors are errdefs categories,
// translated to gRPC codes by the server's interceptor.
type Functions struct {
	pb.UnimplementedFunctionRuntimeServer
	cfg FunctionsConfig
	log *slog.Logger

	mu     sync.Mutex
	regs   map[string]*registration
	closed bool
	wg     sync.WaitGroup // init, supervision and release goroutines
}

// NewFunctions returns an empty registration table.
func NewFunctions(cfg FunctionsConfig) (*Functions, error) {
	if cfg.Adapter == nil || cfg.Workspace == nil || cfg.ScratchRoot == "" {
		return nil, errors.New("functions: adapter, workspace and scratch root are required")
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.DefaultInvokeTimeout <= 0 {
		cfg.DefaultInvokeTimeout = bounds.DefaultInvokeTimeout
	}
	if cfg.MaxInvokeTimeout <= 0 {
		cfg.MaxInvokeTimeout = bounds.MaxInvokeTimeout
	}
	if cfg.DefaultInvokeTimeout > cfg.MaxInvokeTimeout {
		cfg.DefaultInvokeTimeout = cfg.MaxInvokeTimeout
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = bounds.InitTimeout
	}
	if err := os.MkdirAll(cfg.ScratchRoot, 0o700); err != nil {
		return nil, fmt.Errorf("scratch root: %w", err)
	}
	for _, d := range []string{cfg.ScratchRoot, cfg.IPCRoot} {
		if d == "" {
			continue
		}
		if err := cfg.User.Passage(d); err != nil {
			return nil, fmt.Errorf("scratch root: %w", err)
		}
	}
	return &Functions{cfg: cfg, log: cfg.Logger, regs: map[string]*registration{}}, nil
}

// registration is one local generation of a function Run.
type registration struct {
	f       *Functions
	uid     string
	id      string
	attempt int32
	digest  string
	spec    FunctionSpec
	scratch string
	log     *slog.Logger
	out     *runlog.Sink // nil: the output is not logged

	// ctx lives as long as the generation; cancelling it aborts loading,
	// cancels the invocation in flight and stops supervision.
	ctx    context.Context
	cancel context.CancelFunc

	initDone chan struct{} // closed when the first Load finished

	busy         atomic.Bool // one invocation in flight
	lastActivity atomic.Int64
	invocations  atomic.Uint64 // numbers each invocation's scope

	mu        sync.Mutex
	state     pb.FunctionRegistrationState
	fatal     string
	inst      Instance      // nil while loading or replacing
	instReady chan struct{} // closed when inst is set or the state is FAILED
	inflight  *inflight     // the invocation in flight, if any

	releaseOnce sync.Once
	released    chan struct{}
}

type inflight struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// errDrainCancelled is the cause of an invocation cancelled by
// UnregisterFunction or by supersession.
var errDrainCancelled = errdefs.Errorf(errdefs.ErrFailedPrecondition, "invocation cancelled: registration is being unregistered")

func (r *registration) ref() *pb.FunctionRegistration {
	return &pb.FunctionRegistration{RunUid: r.uid, RegistrationId: r.id}
}

func (r *registration) snapshot() (pb.FunctionRegistrationState, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state, r.fatal
}

// RegisterFunction creates or resumes a registration (see the contract's
// "Registration and Status Semantics").
func (f *Functions) RegisterFunction(ctx context.Context, req *pb.RegisterFunctionRequest) (*pb.RegisterFunctionResponse, error) {
	if err := ValidateRunUID("run_uid", req.GetRunUid()); err != nil {
		return nil, err
	}
	if req.GetRegistrationAttempt() < 1 {
		return nil, errdefs.InvalidArgument("registration_attempt", "must be at least 1, got %d", req.GetRegistrationAttempt())
	}
	workingDir, err := f.cfg.Workspace.Resolve("working_dir", req.GetWorkingDir())
	if err != nil {
		return nil, err
	}
	if err := f.validateHandler(req.GetHandler()); err != nil {
		return nil, err
	}
	if err := validation.Env("env", req.GetEnv()); err != nil {
		return nil, err
	}
	if req.GetIdleTimeoutSeconds() < 0 {
		return nil, errdefs.InvalidArgument("idle_timeout_seconds", "must not be negative")
	}
	if err := ValidateDigest("registration_digest", req.GetRegistrationDigest()); err != nil {
		return nil, err
	}

	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "runtime server is shutting down")
	}
	cur := f.regs[req.GetRunUid()]
	var r *registration
	switch {
	case cur != nil && req.GetRegistrationAttempt() == cur.attempt:
		if req.GetRegistrationDigest() != cur.digest {
			f.mu.Unlock()
			return nil, errdefs.Errorf(errdefs.ErrAlreadyExists,
				"run %s: registration attempt %d already exists with a different registration_digest", cur.uid, cur.attempt)
		}
		r = cur
	case cur != nil && req.GetRegistrationAttempt() < cur.attempt:
		f.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"run %s: registration attempt %d is older than the current attempt %d", cur.uid, req.GetRegistrationAttempt(), cur.attempt)
	default:
		if cur != nil {
			cur.log.Info("registration superseded", "attempt", cur.attempt, "new_attempt", req.GetRegistrationAttempt())
			delete(f.regs, cur.uid)
			f.releaseAsync(cur, true)
		}
		r, err = f.newRegistration(req, workingDir)
		if err != nil {
			f.mu.Unlock()
			return nil, err
		}
		f.regs[r.uid] = r
		f.wg.Add(1)
		go r.initialise()
	}
	f.mu.Unlock()

	// Wait for initialisation until shortly before this call's own
	// deadline, so that the caller receives REGISTERING rather than
	// DeadlineExceeded; loading goes on.
	wait := ctx
	if deadline, ok := ctx.Deadline(); ok {
		margin := min(time.Until(deadline)/10, 50*time.Millisecond)
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, deadline.Add(-margin))
		defer cancel()
	}
	select {
	case <-r.initDone:
	case <-wait.Done():
	}
	state, _ := r.snapshot()
	return &pb.RegisterFunctionResponse{Registration: r.ref(), State: state}, nil
}

func (f *Functions) validateHandler(h string) error {
	if h == "" {
		return errdefs.InvalidArgument("handler", "must not be empty")
	}
	if len(h) > bounds.Handler {
		return errdefs.InvalidArgument("handler", "is %d bytes, at most %d allowed", len(h), bounds.Handler)
	}
	if err := f.cfg.Adapter.ValidateHandler(h); err != nil {
		return errdefs.InvalidArgument("handler", "%v", err)
	}
	return nil
}

// newRegistration builds a generation; f.mu is held.
func (f *Functions) newRegistration(req *pb.RegisterFunctionRequest, workingDir string) (*registration, error) {
	id := newID("reg_")
	scratch := filepath.Join(f.cfg.ScratchRoot, id)
	ipc, tmp := filepath.Join(scratch, "ipc"), filepath.Join(scratch, "tmp")
	if f.cfg.IPCRoot != "" {
		ipc = filepath.Join(f.cfg.IPCRoot, id)
	}
	// The scratch directory and the adapter's are passages to the user's
	// own TMPDIR and to what the adapter hands over in its directory.
	if err := f.makeScratch(scratch, ipc, tmp); err != nil {
		return nil, fmt.Errorf("run %s: scratch directory: %w", req.GetRunUid(), err)
	}
	if err := f.cfg.User.Give(workingDir); err != nil {
		_ = os.RemoveAll(scratch)
		return nil, fmt.Errorf("run %s: working directory: %w", req.GetRunUid(), err)
	}
	log := f.log.With("run_uid", req.GetRunUid(), "registration_id", id)
	var out *runlog.Sink
	if f.cfg.Logs != nil {
		var err error
		if out, err = f.cfg.Logs.OpenRun(req.GetRunUid()); err != nil {
			log.Warn("handler output not logged", "error", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &registration{
		f: f, uid: req.GetRunUid(), id: id, attempt: req.GetRegistrationAttempt(),
		digest: req.GetRegistrationDigest(), scratch: scratch, log: log, out: out,
		ctx: ctx, cancel: cancel,
		initDone:  make(chan struct{}),
		state:     pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING,
		instReady: make(chan struct{}),
		released:  make(chan struct{}),
	}
	r.spec = FunctionSpec{
		RunUID:     r.uid,
		WorkingDir: workingDir,
		Handler:    req.GetHandler(),
		Env:        MergeEnv(baseEnvWith(f.cfg.BaseEnv, workingDir, tmp), req.GetEnv()),
		ScratchDir: ipc,
		User:       f.cfg.User,
		Logger:     log,
		Output:     out,
	}
	if sc := f.cfg.Scopes; sc != nil {
		// The registration's ID is unique and random: its scope's name.
		// Last, so that it wins over the registration's own env.
		sc.Begin(id)
		r.spec.Env = append(r.spec.Env, scopeEnv(id))
	}
	return r, nil
}

// makeScratch makes a registration's directories: scratch, holding tmp,
// and the adapter's ipc (inside scratch, or in IPCRoot).
func (f *Functions) makeScratch(scratch, ipc, tmp string) error {
	u := f.cfg.User
	if u == nil {
		for _, d := range []string{ipc, tmp} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
		return nil
	}
	if err := u.Passage(scratch); err != nil {
		return err
	}
	if err := u.Passage(ipc); err != nil {
		return err
	}
	return u.Mkdir(tmp)
}

// load runs one bounded Load of the handler.
func (r *registration) load() (Instance, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.f.cfg.InitTimeout)
	defer cancel()
	start := time.Now()
	inst, err := r.f.cfg.Adapter.Load(ctx, r.spec)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded && r.ctx.Err() == nil {
			err = fmt.Errorf("initialisation did not finish within %s: %w", r.f.cfg.InitTimeout, err)
		}
		return nil, err
	}
	r.log.Debug("handler loaded", "handler", r.spec.Handler, "duration", time.Since(start))
	return inst, nil
}

func (r *registration) initialise() {
	defer r.f.wg.Done()
	defer close(r.initDone)
	inst, err := r.load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.ctx.Err() == nil {
			r.failLocked(err)
		}
		return
	}
	if r.state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING {
		// Unregistered or superseded while loading.
		_ = inst.Close()
		return
	}
	r.inst = inst
	r.state = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY
	close(r.instReady)
	r.lastActivity.Store(time.Now().UnixNano())
	r.log.Info("registration ready", "attempt", r.attempt, "handler", r.spec.Handler)
	r.f.wg.Add(1)
	go r.supervise(inst)
}

// failLocked marks the generation FAILED; r.mu is held.
func (r *registration) failLocked(err error) {
	r.state = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED
	r.fatal = bounds.Truncate(err.Error(), bounds.Message)
	select {
	case <-r.instReady:
	default:
		close(r.instReady)
	}
	r.log.Warn("registration failed", "fatal_error", r.fatal)
}

// supervise replaces an instance that died (a worker killed after a
// timeout, or one that crashed) without leaving READY; if the replacement
// cannot initialise, the generation becomes FAILED.
func (r *registration) supervise(inst Instance) {
	defer r.f.wg.Done()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-inst.Done():
		}
		_ = inst.Close()
		r.mu.Lock()
		if r.ctx.Err() != nil {
			r.mu.Unlock()
			return
		}
		r.retireLocked(inst)
		r.mu.Unlock()
		r.log.Info("replacing runtime instance")

		next, err := r.load()
		r.mu.Lock()
		if err != nil {
			if r.ctx.Err() == nil {
				r.failLocked(fmt.Errorf("replacing the runtime instance failed: %w", err))
			}
			r.mu.Unlock()
			return
		}
		if r.ctx.Err() != nil {
			r.mu.Unlock()
			_ = next.Close()
			return
		}
		r.inst = next
		close(r.instReady)
		r.mu.Unlock()
		inst = next
	}
}

// retireLocked takes a dead instance out of service; invocations then wait
// on the new instReady until the supervisor has loaded a replacement. r.mu
// is held. Only the first caller for a given instance swaps the channel.
func (r *registration) retireLocked(dead Instance) {
	if r.inst != dead {
		return
	}
	r.inst = nil
	r.instReady = make(chan struct{})
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// lookup finds the current generation for ref and checks the ID.
func (f *Functions) lookup(ref *pb.FunctionRegistration) (*registration, error) {
	if err := ValidateRunUID("registration.run_uid", ref.GetRunUid()); err != nil {
		return nil, err
	}
	if ref.GetRegistrationId() == "" {
		return nil, errdefs.InvalidArgument("registration.registration_id", "must not be empty")
	}
	f.mu.Lock()
	r := f.regs[ref.GetRunUid()]
	f.mu.Unlock()
	if r == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s: no function registration", ref.GetRunUid())
	}
	if r.id != ref.GetRegistrationId() {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration %s is stale", ref.GetRunUid(), ref.GetRegistrationId())
	}
	return r, nil
}

// FunctionStatus reads local state only.
func (f *Functions) FunctionStatus(_ context.Context, req *pb.FunctionStatusRequest) (*pb.FunctionStatusResponse, error) {
	r, err := f.lookup(req.GetRegistration())
	if err != nil {
		return nil, err
	}
	state, fatal := r.snapshot()
	var inFlight int32
	if r.busy.Load() {
		inFlight = 1
	}
	return &pb.FunctionStatusResponse{
		Registration:         r.ref(),
		State:                state,
		InFlight:             inFlight,
		LastActivityUnixNano: r.lastActivity.Load(),
		FatalError:           fatal,
	}, nil
}

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
		invID = newID("inv_")
	}
	if state, _ := r.snapshot(); state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration is %s, not ready", r.uid, stateName(state))
	}
	if !r.busy.CompareAndSwap(false, true) {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "run %s: an invocation is already in flight", r.uid)
	}
	defer r.busy.Store(false)

	invCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	invCtx, cancelTimeout := context.WithTimeout(invCtx, timeout)
	defer cancelTimeout()
	fl := &inflight{cancel: cancel, done: make(chan struct{})}
	defer close(fl.done)

	r.mu.Lock()
	if r.state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		state := r.state
		r.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: registration is %s, not ready", r.uid, stateName(state))
	}
	r.inflight = fl
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight = nil
		r.mu.Unlock()
	}()

	r.lastActivity.Store(time.Now().UnixNano())
	defer func() { r.lastActivity.Store(time.Now().UnixNano()) }()

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

	deadline, _ := invCtx.Deadline()
	start := time.Now()
	call := Invocation{ID: invID, RunUID: r.uid, Input: input, Deadline: deadline}
	if sc := f.cfg.Scopes; sc != nil {
		call.Scope = r.id + "." + strconv.FormatUint(r.invocations.Add(1), 10)
		sc.Begin(call.Scope)
		defer sc.End(call.Scope)
	}
	res, err := inst.Invoke(invCtx, call)
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

// invokeCtxErr explains why an invocation's context ended.
func (f *Functions) invokeCtxErr(invCtx context.Context, r *registration, invID string, timeout time.Duration) error {
	if cause := context.Cause(invCtx); errors.Is(cause, errDrainCancelled) {
		return fmt.Errorf("invocation %s: %w", invID, cause)
	}
	if errors.Is(invCtx.Err(), context.DeadlineExceeded) {
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
	if ct == "" {
		return nil
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

// UnregisterFunction drains or cancels work and removes the generation.
func (f *Functions) UnregisterFunction(ctx context.Context, req *pb.UnregisterFunctionRequest) (*pb.UnregisterFunctionResponse, error) {
	ref := req.GetRegistration()
	if req.GetDrainTimeoutMillis() < 0 {
		return nil, errdefs.InvalidArgument("drain_timeout_millis", "must not be negative")
	}
	r, err := f.lookup(ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &pb.UnregisterFunctionResponse{Registration: ref}, nil
	}
	if err != nil {
		return nil, err
	}
	drain := time.Duration(req.GetDrainTimeoutMillis()) * time.Millisecond
	if drain > f.cfg.MaxInvokeTimeout || drain < 0 {
		drain = f.cfg.MaxInvokeTimeout
	}
	if req.GetCancelInFlight() {
		drain = 0
	}
	r.release(ctx, drain)
	r.log.Info("registration unregistered", "cancel_in_flight", req.GetCancelInFlight())
	return &pb.UnregisterFunctionResponse{Registration: r.ref()}, nil
}

// releaseAsync releases a superseded or shut-down generation in the
// background, cancelling its invocation at once.
func (f *Functions) releaseAsync(r *registration, cancelInFlight bool) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		var drain time.Duration
		if !cancelInFlight {
			drain = f.cfg.MaxInvokeTimeout
		}
		r.release(context.Background(), drain)
	}()
}

// release moves the generation to DRAINING, lets the invocation in flight
// finish for at most drain, cancels it, and frees every process and file.
// Concurrent callers all return once the generation is released (or ctx
// ends).
func (r *registration) release(ctx context.Context, drain time.Duration) {
	r.mu.Lock()
	if r.state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED {
		r.state = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_DRAINING
	}
	fl := r.inflight
	r.mu.Unlock()

	r.releaseOnce.Do(func() {
		r.f.wg.Add(1)
		go func() {
			defer r.f.wg.Done()
			defer close(r.released)
			if fl != nil && drain > 0 {
				t := time.NewTimer(drain)
				select {
				case <-fl.done:
				case <-t.C:
				}
				t.Stop()
			}
			if fl != nil {
				fl.cancel(errDrainCancelled)
				<-fl.done
			}
			r.cancel() // stops loading and supervision
			<-r.initDone
			r.mu.Lock()
			inst := r.inst
			r.inst = nil
			r.mu.Unlock()
			if inst != nil {
				_ = inst.Close()
			}
			if sc := r.f.cfg.Scopes; sc != nil {
				sc.End(r.id)
			}
			r.out.Close() // its processes are gone: no more output
			// spec.ScratchDir may lie outside scratch, on IPCRoot.
			for _, dir := range []string{r.spec.ScratchDir, r.scratch} {
				if err := os.RemoveAll(dir); err != nil {
					r.log.Warn("removing scratch directory", "dir", dir, "error", err)
				}
			}
			// The generation stayed in the table while it drained, so that
			// FunctionStatus reported DRAINING; it leaves now unless a newer
			// attempt has replaced it meanwhile.
			r.f.mu.Lock()
			if r.f.regs[r.uid] == r {
				delete(r.f.regs, r.uid)
			}
			r.f.mu.Unlock()
		}()
	})
	select {
	case <-r.released:
	case <-ctx.Done():
	}
}

// Close unregisters every function, cancelling invocations after grace,
// and waits for all of them to be released.
func (f *Functions) Close(grace time.Duration) {
	f.mu.Lock()
	f.closed = true
	regs := f.regs
	f.regs = map[string]*registration{}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.release(context.Background(), grace)
		}()
	}
	wg.Wait()
	f.wg.Wait()
}

func stateName(s pb.FunctionRegistrationState) string {
	switch s {
	case pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING:
		return "REGISTERING"
	case pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY:
		return "READY"
	case pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_DRAINING:
		return "DRAINING"
	case pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED:
		return "FAILED"
	}
	return "UNSPECIFIED"
}
