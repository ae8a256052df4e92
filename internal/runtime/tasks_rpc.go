package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	stokeexec "stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/randid"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/validation"
)

// Execute validates the request and starts the execution, returning once
// its process has started (or failed to start), never waiting for it to
// end. A start failure is the execution's FAILED state, not an RPC error.
//
// A repeated id returns the existing execution. The syntax of the whole
// request is checked first, but the working directory is only resolved for
// a new execution, so a retry still finds its execution after the
// directory is gone.
func (t *Tasks) Execute(_ context.Context, req *pb.ExecuteRequest) (*pb.ExecuteResponse, error) {
	id := req.GetId()
	if err := validateExecutionID(id); err != nil {
		return nil, err
	}
	if req.GetHandler() != "" {
		return nil, errdefs.InvalidArgument("handler", "must be empty: there is no function emulation through Execute")
	}
	if err := validateTaskCommand(req.GetEntrypoint(), req.GetArgs()); err != nil {
		return nil, err
	}
	if err := validation.Env("env", req.GetEnv()); err != nil {
		return nil, err
	}
	if sz := req.GetTtySize(); sz.GetWidth() > math.MaxUint16 || sz.GetHeight() > math.MaxUint16 {
		return nil, errdefs.InvalidArgument("tty_size", "is %d×%d, at most %d each", sz.GetWidth(), sz.GetHeight(), math.MaxUint16)
	}
	if r, ok := t.cfg.Adapter.(Relayer); ok && r.RelaysTasks() && (req.GetStdin() || req.GetTty()) {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "execution %q: stdin and tty: runtime %s runs its tasks elsewhere, without a stdin or terminal here", id, t.cfg.Adapter.Name())
	}
	timeout, err := t.taskTimeout(req.GetTimeoutSeconds())
	if err != nil {
		return nil, err
	}

	t.mu.Lock()
	_, exists := t.execs[id]
	t.mu.Unlock()
	if exists {
		return &pb.ExecuteResponse{Id: id}, nil
	}

	workingDir, err := t.cfg.Workspace.Resolve("working_dir", req.GetWorkingDir())
	if err != nil {
		return nil, err
	}
	argv, err := t.cfg.Adapter.TaskCommand(req.GetEntrypoint(), req.GetArgs(), timeout)
	if err != nil {
		return nil, errdefs.InvalidArgument("entrypoint", "%v", err)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "execution %q: adapter %s returned an empty command", id, t.cfg.Adapter.Name())
	}
	// The directory is named by a generated ID, never by the caller's id,
	// so that id needs no file-name rules.
	scratch := filepath.Join(t.cfg.ScratchRoot, randid.New("task_"))
	tmp := filepath.Join(scratch, scratchTmp)
	if err := t.scratch.Make(scratch); err != nil {
		return nil, fmt.Errorf("execution %q: scratch directory: %w", id, err)
	}
	// Handed over once made (both are the server's until then): the
	// scratch directory, where the task makes its outputs file, and the
	// working directory that runtimed filled.
	if err := errors.Join(t.cfg.User.Give(scratch), t.cfg.User.Give(workingDir)); err != nil {
		_ = t.removeScratch(scratch)
		return nil, fmt.Errorf("execution %q: handing its directories to the Runs' user: %w", id, err)
	}
	l := launch{argv: argv, dir: workingDir, stdin: req.GetStdin() || req.GetTty(), tty: req.GetTty(), outputs: filepath.Join(scratch, scratchOutputs),
		githubOutput: filepath.Join(scratch, scratchGitHubOutput), githubEnv: filepath.Join(scratch, scratchGitHubEnv),
		githubPath: filepath.Join(scratch, scratchGitHubPath), githubSummary: filepath.Join(scratch, scratchGitHubSummary),
		githubState: filepath.Join(scratch, scratchGitHubState)}
	if sz := req.GetTtySize(); l.tty {
		l.size = stokeexec.TermSize{Width: uint16(sz.GetWidth()), Height: uint16(sz.GetHeight())}
	}
	l.env, l.envPath = taskEnv(baseEnvWith(t.cfg.BaseEnv, workingDir, tmp), req.GetEnv(), &l)
	if l.tty && !slices.ContainsFunc(l.env, func(kv string) bool { return strings.HasPrefix(kv, "TERM=") }) {
		l.env = append(l.env, "TERM=xterm") // as exec sessions with a TTY
	}
	if r, ok := t.cfg.Adapter.(Relayer); ok && r.RelaysTasks() {
		l.setupFailure = filepath.Join(scratch, scratchSetupFailure)
		l.env = append(l.env, EnvSetupFailure+"="+l.setupFailure) // after the request's env: it wins
	}
	// The scratch directory's name is unique and random: the scope's.
	scope := filepath.Base(scratch)
	if t.cfg.Scopes != nil {
		l.env = append(l.env, scopeEnv(scope)) // last: it wins over the request's env
	}

	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = t.removeScratch(scratch)
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "execution %q: runtime server is shutting down", id)
	}
	if _, exists := t.execs[id]; exists {
		// A concurrent Execute with the same id won the race.
		t.mu.Unlock()
		_ = t.removeScratch(scratch)
		return &pb.ExecuteResponse{Id: id}, nil
	}
	e := &execution{
		id:        id,
		scope:     scope,
		scratch:   scratch,
		log:       t.log.With("execution_id", id),
		out:       t.openLog(id),
		timeout:   timeout,
		cancelled: make(chan struct{}),
		done:      make(chan struct{}),
		stdout:    tailBuffer{max: bounds.CapturedStream},
		stderr:    tailBuffer{max: bounds.CapturedStream},
		state:     pb.ExecutionState_EXECUTION_STATE_PENDING,
		dir:       l.dir,
		env:       l.env,
	}
	t.execs[id] = e
	// Added under t.mu while not closed, so Close's Wait covers it.
	t.wg.Add(1)
	t.mu.Unlock()
	if t.cfg.Scopes != nil {
		t.cfg.Scopes.Begin(scope)
	}

	if tp, ok := t.cfg.Adapter.(TaskPreparer); ok && tp.TaskNeedsPrepare(l.dir) {
		go t.prepareAndStart(e, l, tp) // may take long: Execute returns at once
	} else {
		t.start(e, l)
	}
	return &pb.ExecuteResponse{Id: id}, nil
}

// openLog returns the Sink of execution id's output, nil when its output
// is not logged.
func (t *Tasks) openLog(id string) *runlog.Sink {
	if t.cfg.Logs == nil {
		return nil
	}
	out, err := t.cfg.Logs.OpenExecution(id)
	if err != nil {
		t.log.Warn("execution output not logged", "execution_id", id, "error", err)
	}
	return out
}

// validateExecutionID checks an execution id: runtimed uses the Run UID.
func validateExecutionID(id string) error {
	switch {
	case id == "":
		return errdefs.InvalidArgument("id", "must not be empty")
	case len(id) > bounds.RunUID:
		return errdefs.InvalidArgument("id", "is %d bytes, at most %d allowed", len(id), bounds.RunUID)
	case !utf8.ValidString(id):
		return errdefs.InvalidArgument("id", "is not valid UTF-8")
	}
	return nil
}

// validateTaskCommand checks the entrypoint and args; both end up in argv,
// so both get the argument bounds.
func validateTaskCommand(entrypoint string, args []string) error {
	if entrypoint != "" {
		if len(entrypoint) > bounds.Arg {
			return errdefs.InvalidArgument("entrypoint", "is %d bytes, at most %d allowed", len(entrypoint), bounds.Arg)
		}
		if err := validation.RelativePath("entrypoint", entrypoint); err != nil {
			return err
		}
	}
	if len(args) > bounds.Args {
		return errdefs.InvalidArgument("args", "%d entries, at most %d allowed", len(args), bounds.Args)
	}
	for i, a := range args {
		field := fmt.Sprintf("args[%d]", i)
		if len(a) > bounds.Arg {
			return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(a), bounds.Arg)
		}
		// execve cannot pass a NUL; reject it here rather than fail at start.
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.InvalidArgument(field, "contains a NUL byte")
		}
	}
	return nil
}

// taskTimeout turns timeout_seconds into the execution's limit.
func (t *Tasks) taskTimeout(secs int64) (time.Duration, error) {
	switch {
	case secs < 0:
		return 0, errdefs.InvalidArgument("timeout_seconds", "must not be negative")
	case secs == 0:
		return t.cfg.MaxTaskDuration, nil
	}
	// Compare in seconds before multiplying so that a huge value cannot
	// overflow into a short or negative duration.
	if secs > int64(t.cfg.MaxTaskDuration/time.Second) {
		return t.cfg.MaxTaskDuration, nil
	}
	return time.Duration(secs) * time.Second, nil
}

// Status reads the state of one execution, with the captured output so far.
func (t *Tasks) Status(_ context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	e, err := t.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	return t.withAgent(e, e.status(true)), nil
}

// withAgent adds agent_connected to r, e's status, for an AgentReporter:
// never connected once terminal, whatever is left of the invocation.
func (t *Tasks) withAgent(e *execution, r *pb.StatusResponse) *pb.StatusResponse {
	if ar, ok := t.cfg.Adapter.(AgentReporter); ok {
		connected, _ := ar.TaskAgent(e.dir)
		connected = connected && !isTerminalState(r.State)
		r.AgentConnected = &connected
	}
	return r
}

// List summarises every remembered execution, sorted by id; Status has the
// details.
func (t *Tasks) List(context.Context, *pb.ListRequest) (*pb.ListResponse, error) {
	t.mu.Lock()
	execs := slices.Collect(maps.Values(t.execs))
	t.mu.Unlock()
	slices.SortFunc(execs, func(a, b *execution) int { return strings.Compare(a.id, b.id) })
	resp := &pb.ListResponse{Entries: make([]*pb.StatusResponse, 0, len(execs))}
	for _, e := range execs {
		resp.Entries = append(resp.Entries, e.status(false))
	}
	return resp, nil
}

// Wait returns once the execution is terminal, or with its current state
// shortly before the call's deadline (see waitMargin) or when the call ends;
// for an AgentReporter and a request with agent_connected_seen, also once
// agent_connected differs from it.
func (t *Tasks) Wait(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	e, err := t.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	var early <-chan time.Time
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		timer := time.NewTimer(left - waitMargin(left))
		defer timer.Stop()
		early = timer.C
	}
	ar, _ := t.cfg.Adapter.(AgentReporter)
	seen := req.AgentConnectedSeen
	for {
		var agentChanged <-chan struct{}
		if ar != nil && seen != nil {
			connected, changed := ar.TaskAgent(e.dir)
			if connected != *seen {
				break // news for the caller
			}
			agentChanged = changed
		}
		select {
		case <-e.done:
		case <-early:
		case <-ctx.Done():
		case <-agentChanged:
			continue
		}
		break
	}
	return t.withAgent(e, e.status(true)), nil
}

// waitMargin is how long before its deadline a call that waits (Wait,
// RegisterFunction) answers, so that the current state reaches a gRPC
// client before the client's own deadline turns the call into
// DeadlineExceeded. The server's deadline is the client's time left counted
// from the call's arrival, so the margin must cover the call's way in as
// well as the answer's way out: on a loaded machine (CI at load 20-50)
// tens to hundreds of milliseconds, past the 50 ms RegisterFunction kept.
func waitMargin(left time.Duration) time.Duration {
	return max(0, min(left/10, time.Second))
}

// Cancel kills a running execution's process group (SIGTERM, SIGKILL after
// the kill grace) and returns once it is CANCELLED or the call ends;
// cancelling a finished execution changes nothing.
func (t *Tasks) Cancel(ctx context.Context, req *pb.CancelRequest) (*pb.CancelResponse, error) {
	e, err := t.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	if e.isTerminal() {
		return &pb.CancelResponse{}, nil
	}
	e.cancelOnce.Do(func() {
		e.log.Info("cancel requested")
		close(e.cancelled)
	})
	select {
	case <-e.done:
	case <-ctx.Done():
		// The kill goes on; a later Status shows CANCELLED.
	}
	return &pb.CancelResponse{}, nil
}

// Forget drops a finished execution and whatever is left of its scratch
// directory. An unknown id is OK, so that runtimed can retry a Forget whose
// answer it lost.
func (t *Tasks) Forget(_ context.Context, req *pb.ForgetRequest) (*pb.ForgetResponse, error) {
	id := req.GetId()
	if err := validateExecutionID(id); err != nil {
		return nil, err
	}
	t.mu.Lock()
	e := t.execs[id]
	if e == nil {
		t.mu.Unlock()
		return &pb.ForgetResponse{}, nil
	}
	if !e.isTerminal() {
		t.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"execution %q is still running; cancel it or wait for it before forgetting it", id)
	}
	delete(t.execs, id)
	if e.elem != nil {
		t.terminal.Remove(e.elem)
		e.elem = nil
	}
	t.mu.Unlock()
	if e.scratchRemoved {
		return &pb.ForgetResponse{}, nil
	}
	if err := t.removeScratch(e.scratch); err != nil {
		return nil, fmt.Errorf("execution %q: removing scratch directory: %w", id, err)
	}
	return &pb.ForgetResponse{}, nil
}

// Health reports whether Execute accepts work.
func (t *Tasks) Health(context.Context, *pb.HealthRequest) (*pb.HealthResponse, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return &pb.HealthResponse{Healthy: false, Message: "runtime server is shutting down"}, nil
	}
	return &pb.HealthResponse{Healthy: true}, nil
}
