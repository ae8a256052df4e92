package runtime

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/loglines"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/validation"
)

// Defaults for TasksConfig fields left at zero.
const (
	// DefaultMaxTerminal bounds the finished executions a Tasks table
	// remembers. runtimed forgets each one once it has recorded the result,
	// so the table only fills up when runtimed is gone; each remembered
	// execution may hold up to 2 × bounds.CapturedStream of captured output,
	// so this keeps that worst case near 512 MiB.
	DefaultMaxTerminal = 256
	// DefaultKillGrace is how long a timed-out or cancelled execution has
	// between SIGTERM and SIGKILL.
	DefaultKillGrace = 10 * time.Second
)

// pipeDrainGrace bounds how long a finished execution waits for its output
// pipes to reach EOF after its process group was killed. Only a process that
// left the group (setsid) can hold them open that long; its output is then
// cut off rather than keeping the execution from finishing.
const pipeDrainGrace = 2 * time.Second

// noExitCode is the exit_code of an execution whose process never ran or
// whose exit status is unknown, as in proc.ExitCode.
const noExitCode = -1

// TasksConfig configures a Tasks table.
type TasksConfig struct {
	Adapter   Adapter
	Workspace *Workspace
	// ScratchRoot holds one private directory per execution for TMPDIR and
	// the $STOKE_OUTPUTS file; it is removed when the execution finishes.
	ScratchRoot string
	Logger      *slog.Logger
	// MaxTaskDuration applies when a request's timeout_seconds is 0 and
	// clamps larger ones. Default bounds.MaxTaskDuration.
	MaxTaskDuration time.Duration
	// KillGrace is the SIGTERM→SIGKILL grace on timeout and Cancel.
	KillGrace time.Duration
	// MaxTerminal bounds the finished executions remembered; past it the
	// oldest finished one is forgotten. Running ones are never forgotten.
	MaxTerminal int
}

// Tasks is the Runtime (one-shot) implementation of one Runtime Server: the
// table of executions by id, each a process group started from the
// adapter's TaskCommand and supervised until it ends. It implements
// executorv1.RuntimeServer so that it can be served over gRPC or called
// in-process; its errors are errdefs categories, translated to gRPC codes by
// the server's interceptor.
//
// An execution moves PENDING → RUNNING → SUCCEEDED | FAILED | TIMED_OUT |
// CANCELLED. A terminal execution has no process left (the group is killed
// when its leader exits, so background jobs never outlive it) and no
// scratch directory.
type Tasks struct {
	pb.UnimplementedRuntimeServer
	cfg TasksConfig
	log *slog.Logger

	mu       sync.Mutex
	execs    map[string]*execution
	terminal *list.List // of *execution, in the order they finished
	closed   bool
	wg       sync.WaitGroup // one per execution until it is terminal

	// closing is closed by Close; supervisors then kill their groups with
	// closeGrace, written before closing is closed.
	closing    chan struct{}
	closeGrace time.Duration
}

// NewTasks returns an empty execution table.
func NewTasks(cfg TasksConfig) (*Tasks, error) {
	if cfg.Adapter == nil || cfg.Workspace == nil || cfg.ScratchRoot == "" {
		return nil, errors.New("tasks: adapter, workspace and scratch root are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxTaskDuration <= 0 {
		cfg.MaxTaskDuration = bounds.MaxTaskDuration
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.MaxTerminal <= 0 {
		cfg.MaxTerminal = DefaultMaxTerminal
	}
	if err := os.MkdirAll(cfg.ScratchRoot, 0o700); err != nil {
		return nil, fmt.Errorf("scratch root: %w", err)
	}
	return &Tasks{
		cfg:      cfg,
		log:      cfg.Logger,
		execs:    map[string]*execution{},
		terminal: list.New(),
		closing:  make(chan struct{}),
	}, nil
}

// execution is one one-shot program run.
type execution struct {
	id      string
	scratch string
	log     *slog.Logger
	timeout time.Duration

	cancelOnce sync.Once
	cancelled  chan struct{} // closed by Cancel
	done       chan struct{} // closed once the state is terminal

	stdout, stderr tailBuffer

	mu       sync.Mutex
	state    pb.ExecutionState
	exitCode int32
	errMsg   string
	outputs  map[string]string
	// The captured streams once terminal; the buffers are released then.
	finalStdout, finalStderr string

	elem *list.Element // in Tasks.terminal; guarded by Tasks.mu
}

// launch is what starting an execution needs, resolved by Execute.
type launch struct {
	argv    []string
	dir     string
	envPath string // the child's PATH, to resolve argv[0] in
	env     []string
	outputs string // the $STOKE_OUTPUTS file
}

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
	argv, err := t.cfg.Adapter.TaskCommand(req.GetEntrypoint(), req.GetArgs())
	if err != nil {
		return nil, errdefs.InvalidArgument("entrypoint", "%v", err)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "execution %q: adapter %s returned an empty command", id, t.cfg.Adapter.Name())
	}
	// The directory is named by a generated ID, never by the caller's id,
	// so that id needs no file-name rules.
	scratch := filepath.Join(t.cfg.ScratchRoot, newID("task_"))
	tmp := filepath.Join(scratch, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("execution %q: scratch directory: %w", id, err)
	}
	l := launch{argv: argv, dir: workingDir, outputs: filepath.Join(scratch, "outputs")}
	l.env, l.envPath = taskEnv(BaseEnv(workingDir, tmp), req.GetEnv(), l.outputs)

	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = os.RemoveAll(scratch)
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "execution %q: runtime server is shutting down", id)
	}
	if _, exists := t.execs[id]; exists {
		// A concurrent Execute with the same id won the race.
		t.mu.Unlock()
		_ = os.RemoveAll(scratch)
		return &pb.ExecuteResponse{Id: id}, nil
	}
	e := &execution{
		id:        id,
		scratch:   scratch,
		log:       t.log.With("execution_id", id),
		timeout:   timeout,
		cancelled: make(chan struct{}),
		done:      make(chan struct{}),
		stdout:    tailBuffer{max: bounds.CapturedStream},
		stderr:    tailBuffer{max: bounds.CapturedStream},
		state:     pb.ExecutionState_EXECUTION_STATE_PENDING,
	}
	t.execs[id] = e
	// Added under t.mu while not closed, so Close's Wait covers it.
	t.wg.Add(1)
	t.mu.Unlock()

	t.start(e, l)
	return &pb.ExecuteResponse{Id: id}, nil
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

// taskEnv builds the child's environment: the minimal base, the request's
// env on top, and $STOKE_OUTPUTS last, because the server decides where it
// reads outputs from. It also returns the child's PATH.
func taskEnv(base, env map[string]string, outputsFile string) ([]string, string) {
	extra := maps.Clone(env)
	if extra == nil {
		extra = map[string]string{}
	}
	extra["STOKE_OUTPUTS"] = outputsFile
	path := base["PATH"]
	if p, ok := extra["PATH"]; ok {
		path = p
	}
	return MergeEnv(base, extra), path
}

// findExecutable resolves a command name the way execvp would in the child:
// a name with a slash is used as given (relative to the working directory),
// a bare name is searched in the child's PATH — never the server's own,
// which exec.Command would use. Relative PATH entries are skipped, as
// exec.LookPath refuses them, so the working directory cannot shadow a
// command.
func findExecutable(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH", name)
}

// start starts e's process and hands it to a supervisor; t.wg was added
// for e, and is released here when nothing starts.
func (t *Tasks) start(e *execution, l launch) {
	fail := func(state pb.ExecutionState, msg string) {
		t.finish(e, state, noExitCode, msg, nil)
		t.wg.Done()
	}
	select {
	case <-e.cancelled:
		fail(pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled before it started")
		return
	case <-t.closing:
		fail(pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled: the runtime server is shutting down")
		return
	default:
	}
	path, err := findExecutable(l.argv[0], l.envPath)
	if err != nil {
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	// Our own pipes rather than exec's copying goroutines: the child's exit
	// is then observed independently of a background job that still holds
	// the write end, and the pumps below always drain them.
	outR, outW, err := os.Pipe()
	if err != nil {
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: stdout pipe: "+err.Error())
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: stderr pipe: "+err.Error())
		return
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   l.argv,
		Dir:    l.dir,
		Env:    l.env,
		Stdout: outW,
		Stderr: errW,
		// Stdin nil is /dev/null: a task never waits for input.
	}
	p, err := proc.Start(cmd)
	closeAll(outW, errW) // the child has its copies; EOF needs ours closed
	if err != nil {
		closeAll(outR, errR)
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	started := time.Now()
	e.mu.Lock()
	e.state = pb.ExecutionState_EXECUTION_STATE_RUNNING
	e.mu.Unlock()
	e.log.Info("execution started", "pid", p.Pid(), "command", l.argv[0], "timeout", e.timeout)
	go t.supervise(e, p, outR, errR, l.outputs, started)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// supervise waits for e's process to exit, its timeout, Cancel or Close,
// kills the group, drains the output and records the outcome.
func (t *Tasks) supervise(e *execution, p *proc.Process, outR, errR *os.File, outputsFile string, started time.Time) {
	defer t.wg.Done()

	drained := make(chan struct{})
	var pumping atomic.Int32
	pumping.Store(2)
	pump := func(r io.Reader, buf *tailBuffer, stream string) {
		defer func() {
			if pumping.Add(-1) == 0 {
				close(drained)
			}
		}()
		loglines.Pump(io.TeeReader(r, buf), func(line []byte) {
			e.log.Info("output", "stream", stream, "line", string(line))
		})
	}
	go pump(outR, &e.stdout, "stdout")
	go pump(errR, &e.stderr, "stderr")

	timer := time.NewTimer(e.timeout)
	defer timer.Stop()
	var stopState pb.ExecutionState // UNSPECIFIED: the process ended by itself
	var stopMsg string
	grace := t.cfg.KillGrace
	select {
	case <-p.Done():
	case <-timer.C:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_TIMED_OUT, fmt.Sprintf("timed out after %s", e.timeout)
	case <-e.cancelled:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled"
	case <-t.closing:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled: the runtime server is shutting down"
		grace = t.closeGrace
	}
	if stopState != pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED {
		select {
		case <-p.Done():
			// It exited before the stop was acted on: its own exit stands.
			stopState = pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED
		default:
			e.log.Info("stopping execution", "reason", stopMsg, "grace", grace)
			p.Kill(grace)
		}
	}
	// Whatever ended the leader, the rest of its group goes too, so that no
	// background job outlives the execution or holds its pipes open.
	p.Kill(0)

	drain := time.NewTimer(pipeDrainGrace)
	select {
	case <-drained:
	case <-drain.C:
		e.log.Warn("output pipes still open after the process group was killed; closing them", "grace", pipeDrainGrace)
		closeAll(outR, errR) // unblocks the pumps' reads
		<-drained
	}
	drain.Stop()
	closeAll(outR, errR)

	code := p.ExitCode()
	var outs map[string]string
	state, msg := stopState, stopMsg
	switch {
	case state != pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED:
	case code == 0 && p.Err() == nil:
		var err error
		if outs, err = readOutputs(outputsFile); err != nil {
			state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, "invalid outputs: "+err.Error()
		} else {
			state = pb.ExecutionState_EXECUTION_STATE_SUCCEEDED
		}
	case code < 0:
		state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, fmt.Sprintf("waiting for the process: %v", p.Err())
	default:
		state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, exitMessage(code, e.stderr.String())
	}
	t.finish(e, state, int32(code), msg, outs)
	e.log.Info("execution finished", "state", stateLabel(state), "exit_code", code, "duration", time.Since(started))
}

// readOutputs reads the $STOKE_OUTPUTS file. It must be a regular file: a
// FIFO left there would block the read forever. The group is dead by now,
// so the file cannot change between the check and the read.
func readOutputs(path string) (map[string]string, error) {
	fi, err := os.Lstat(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("$STOKE_OUTPUTS is not a regular file (%s)", fi.Mode().Type())
	}
	return outputs.ReadFile(path)
}

// exitMessage explains a non-zero exit with the end of stderr, where an
// error usually is, bounded to bounds.Message.
func exitMessage(code int, stderr string) string {
	msg := fmt.Sprintf("exited with status %d", code)
	tail := strings.TrimSpace(stderr)
	if tail == "" {
		return msg
	}
	msg += ": "
	return msg + bounds.TruncateHead(tail, bounds.Message-len(msg))
}

// finish records e's terminal state, removes its scratch directory and
// files it among the finished executions, forgetting the oldest past the
// bound.
func (t *Tasks) finish(e *execution, state pb.ExecutionState, code int32, msg string, outs map[string]string) {
	if err := os.RemoveAll(e.scratch); err != nil {
		e.log.Warn("removing scratch directory", "error", err)
	}
	e.mu.Lock()
	e.state = state
	e.exitCode = code
	e.errMsg = bounds.Truncate(msg, bounds.Message)
	e.outputs = outs
	e.finalStdout, e.finalStderr = e.stdout.String(), e.stderr.String()
	e.stdout.release()
	e.stderr.release()
	e.mu.Unlock()

	// done closes under t.mu, after the bound is applied, so that whoever
	// Waits for e sees the table as it stands once e is filed.
	t.mu.Lock()
	defer t.mu.Unlock()
	defer close(e.done)
	if t.execs[e.id] != e {
		return // forgotten already
	}
	e.elem = t.terminal.PushBack(e)
	for t.terminal.Len() > t.cfg.MaxTerminal {
		old := t.terminal.Remove(t.terminal.Front()).(*execution)
		delete(t.execs, old.id)
		old.log.Info("forgetting the oldest finished execution", "max_terminal", t.cfg.MaxTerminal)
	}
}

func (e *execution) isTerminal() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// status snapshots e. Without full it is the summary List returns: id,
// state and exit code, so that a List of every remembered execution stays
// far below gRPC's message limit.
func (e *execution) status(full bool) *pb.StatusResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := &pb.StatusResponse{Id: e.id, State: e.state, ExitCode: e.exitCode}
	if !full {
		return r
	}
	r.ErrorMessage = e.errMsg
	r.Outputs = maps.Clone(e.outputs)
	if isTerminalState(e.state) {
		r.Stdout, r.Stderr = e.finalStdout, e.finalStderr
	} else {
		r.Stdout, r.Stderr = e.stdout.String(), e.stderr.String()
	}
	return r
}

func isTerminalState(s pb.ExecutionState) bool {
	switch s {
	case pb.ExecutionState_EXECUTION_STATE_SUCCEEDED, pb.ExecutionState_EXECUTION_STATE_FAILED,
		pb.ExecutionState_EXECUTION_STATE_TIMED_OUT, pb.ExecutionState_EXECUTION_STATE_CANCELLED:
		return true
	}
	return false
}

func stateLabel(s pb.ExecutionState) string {
	return strings.TrimPrefix(s.String(), "EXECUTION_STATE_")
}

// lookup finds a remembered execution.
func (t *Tasks) lookup(id string) (*execution, error) {
	if err := validateExecutionID(id); err != nil {
		return nil, err
	}
	t.mu.Lock()
	e := t.execs[id]
	t.mu.Unlock()
	if e == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "execution %q is not known", id)
	}
	return e, nil
}

// Status reads the state of one execution, with the captured output so far.
func (t *Tasks) Status(_ context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	e, err := t.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	return e.status(true), nil
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
// shortly before the call's deadline (see waitMargin) or when the call ends.
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
	select {
	case <-e.done:
	case <-early:
	case <-ctx.Done():
	}
	return e.status(true), nil
}

// waitMargin is how long before its deadline Wait answers, so that the
// current state reaches a gRPC client before the client's own deadline
// turns the call into DeadlineExceeded.
func waitMargin(left time.Duration) time.Duration {
	return max(0, min(left/20, 200*time.Millisecond))
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
	if err := os.RemoveAll(e.scratch); err != nil {
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

// Close refuses new executions, kills every running one (SIGTERM, SIGKILL
// after grace; at once when grace is zero) and waits until all are
// terminal. Remembered executions can still be read. Safe to call twice.
func (t *Tasks) Close(grace time.Duration) {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		t.closeGrace = grace
		close(t.closing)
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// tailBuffer keeps the last max bytes written to it: the end of a
// program's output is where its errors and results are; the whole stream
// goes to the logs. It is a ring that grows to max as needed, so a quiet
// program costs little.
type tailBuffer struct {
	max int

	mu    sync.Mutex
	buf   []byte // len ≤ max; once full, a ring starting at start
	start int
	total int64 // bytes ever written
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(n)
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		b.start = 0
		return n, nil
	}
	if room := b.max - len(b.buf); room > 0 {
		k := min(room, len(p))
		b.buf = append(b.buf, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 { // full: overwrite the oldest bytes
		k := copy(b.buf[b.start:], p)
		p = p[k:]
		b.start = (b.start + k) % b.max
	}
	return n, nil
}

// String returns the kept bytes as valid UTF-8 (protobuf strings must be),
// at most max bytes: a sequence split by the cut is dropped, invalid bytes
// become U+FFFD.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	data := make([]byte, 0, len(b.buf))
	data = append(data, b.buf[b.start:]...)
	data = append(data, b.buf[:b.start]...)
	cut := b.total > int64(len(b.buf))
	b.mu.Unlock()
	if cut {
		for i := 0; i < utf8.UTFMax-1 && len(data) > 0 && !utf8.RuneStart(data[0]); i++ {
			data = data[1:]
		}
	}
	s := strings.ToValidUTF8(string(data), "\uFFFD")
	if len(s) > b.max { // replacements can be longer than what they replace
		s = s[len(s)-b.max:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	return s
}

// release frees the buffer once its content was kept elsewhere; later
// writes (none are expected) start a new one.
func (b *tailBuffer) release() {
	b.mu.Lock()
	b.buf, b.start = nil, 0
	b.mu.Unlock()
}
