package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/randid"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/validation"
)

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

	busy atomic.Bool // one invocation in flight, or its tail
	// tail is closed when the tail of the call that answered last ends;
	// nil when none runs (InvokeFunction, acquire).
	tail         atomic.Pointer[chan struct{}]
	lastActivity atomic.Int64
	invocations  atomic.Uint64 // numbers each invocation's scope

	mu        sync.Mutex
	state     pb.FunctionRegistrationState
	fatal     string
	inst      Instance      // nil while loading or replacing
	instReady chan struct{} // closed when inst is set or the state is FAILED
	inflight  *inflight     // the invocation in flight, if any

	call callCtx // each invocation's context in turn

	releaseOnce sync.Once
	released    chan struct{}
}

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
	// deadline (waitMargin), so that the caller receives REGISTERING
	// rather than DeadlineExceeded; loading goes on.
	wait := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, deadline.Add(-waitMargin(time.Until(deadline))))
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
	id := randid.New("reg_")
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
