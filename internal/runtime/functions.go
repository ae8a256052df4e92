package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runuser"
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
	if sk, ok := cfg.Adapter.(SpareKeeper); ok {
		env := baseEnvWith(cfg.BaseEnv, "", "")
		delete(env, "HOME") // each Run's own
		delete(env, "TMPDIR")
		sk.KeepSpare(SpareSpec{Env: MergeEnv(env, nil), User: cfg.User, Scopes: cfg.Scopes, Logger: cfg.Logger})
	}
	return &Functions{cfg: cfg, log: cfg.Logger, regs: map[string]*registration{}}, nil
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
	if sk, ok := f.cfg.Adapter.(SpareKeeper); ok {
		sk.CloseSpare()
	}
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
