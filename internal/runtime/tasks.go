package runtime

import (
	"container/list"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runuser"
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
	Adapter Adapter
	// Self is the program a task whose command is SelfCommand runs: the
	// server's own executable, so that Stoke's built-in steps (the
	// workflow engine's hash Run) need no stoke on the task's PATH. Empty:
	// SelfCommand is looked up in PATH as any command.
	Self      string
	Workspace *Workspace
	// ScratchRoot holds one private directory per execution for TMPDIR and
	// the $STOKE_OUTPUTS file; it is removed when the execution finishes.
	ScratchRoot string
	Logger      *slog.Logger // events, never output
	// Logs, when set, receives each execution's stdout and stderr, in the
	// log of its Run (runlog.Files.OpenExecution).
	Logs *runlog.Files
	// MaxTaskDuration applies when a request's timeout_seconds is 0 and
	// clamps larger ones. Default bounds.MaxTaskDuration.
	MaxTaskDuration time.Duration
	// KillGrace is the SIGTERM→SIGKILL grace on timeout and Cancel.
	KillGrace time.Duration
	// BaseEnv, when set, is added to every execution's environment
	// beneath the request's env, and is not counted against its bounds
	// (as FunctionsConfig.BaseEnv).
	BaseEnv map[string]string
	// MaxTerminal bounds the finished executions remembered; past it the
	// oldest finished one is forgotten. Running ones are never forgotten.
	MaxTerminal int
	// Scopes, when set, tracks each execution's processes, so that those
	// that left its process group (setsid, a double fork) are killed when
	// it ends too.
	Scopes Scopes
	// Cgroup, when set, is the cgroup v2 under which each execution runs
	// in a child group of its own, started directly in it and killed whole
	// (cgroup.kill) and removed when the execution ends.
	Cgroup *cgroup.Group
	// User, when set, is the unprivileged user the executions run as (a
	// server running as root): each one's working directory and scratch
	// directory are handed to it, and ScratchRoot is a passage
	// (internal/runuser). Nil: as this process.
	User *runuser.User
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
	cfg     TasksConfig
	log     *slog.Logger
	scratch *DirPool // the executions' scratch directories

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
	cfg.Logger = logging.OrDiscard(cfg.Logger)
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
	if err := cfg.User.Passage(cfg.ScratchRoot); err != nil {
		return nil, fmt.Errorf("scratch root: %w", err)
	}
	scratch, err := NewDirPool(filepath.Join(cfg.ScratchRoot, scratchPool), scratchTmp)
	if err != nil {
		return nil, fmt.Errorf("scratch root: %w", err)
	}
	return &Tasks{
		cfg:      cfg,
		scratch:  scratch,
		log:      cfg.Logger,
		execs:    map[string]*execution{},
		terminal: list.New(),
		closing:  make(chan struct{}),
	}, nil
}

// execution is one one-shot program run.
type execution struct {
	id      string
	scope   string        // of its processes (TasksConfig.Scopes)
	cgroup  *cgroup.Group // its own, under TasksConfig.Cgroup; nil if none
	scratch string
	log     *slog.Logger
	out     *runlog.Sink // nil: the output is not logged
	timeout time.Duration

	cancelOnce sync.Once
	cancelled  chan struct{} // closed by Cancel
	done       chan struct{} // closed once the state is terminal

	stdout, stderr tailBuffer
	// dir and env are the execution's, for exec sessions into it.
	dir string
	env []string
	// pid is the task's process (and group) ID once it started, under
	// mu; exec sessions see it as STOKE_TASK_PID, to signal the task.
	pid int
	// attach is the task's own process for attach sessions, under mu;
	// nil unless it was started with stdin or a terminal.
	attach *exec.Attachment

	mu       sync.Mutex
	state    pb.ExecutionState
	exitCode int32
	errMsg   string
	// setupFailed: a Relayer's backend could not be set up; the task
	// never ran (backend_setup_failed).
	setupFailed bool
	outputs     map[string]string
	// exportedEnv is what the task wrote to $GITHUB_ENV.
	exportedEnv map[string]string
	// summary is what it wrote to $GITHUB_STEP_SUMMARY, bounded.
	summary string
	// The captured streams once terminal; the buffers are released then.
	finalStdout, finalStderr string
	// scratchRemoved is set by finish, before done is closed, when the
	// scratch directory is gone, so that Forget need not remove it again.
	scratchRemoved bool

	elem *list.Element // in Tasks.terminal; guarded by Tasks.mu
}

// finish records e's terminal state, removes its scratch directory and
// files it among the finished executions, forgetting the oldest past the
// bound.
func (t *Tasks) finish(e *execution, state pb.ExecutionState, code int32, msg string, res results) {
	// The log says how the attempt ended before anyone can learn it
	// ended, so that a reader that saw the end has every record.
	e.out.Exit(code)
	e.out.Close()
	if t.cfg.Scopes != nil {
		// The process group is dead: what escaped it goes now.
		t.cfg.Scopes.End(e.scope)
	}
	if e.cgroup != nil {
		// Everything in it, whatever session it made, goes now.
		if err := e.cgroup.Remove(); err != nil {
			e.log.Warn("removing the execution's cgroup", "error", err)
		}
	}
	if err := t.removeScratch(e.scratch); err != nil {
		e.log.Warn("removing scratch directory", "error", err)
	} else {
		e.scratchRemoved = true
	}
	e.mu.Lock()
	e.state = state
	e.exitCode = code
	e.errMsg = bounds.Truncate(msg, bounds.Message)
	e.outputs, e.exportedEnv, e.summary = res.outputs, res.env, res.summary
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

// An execution's scratch directory holds these names.
const (
	scratchTmp     = "tmp"     // its TMPDIR
	scratchOutputs = "outputs" // its $STOKE_OUTPUTS file
	// scratchGitHubOutput and scratchGitHubEnv are its $GITHUB_OUTPUT
	// and $GITHUB_ENV files.
	scratchGitHubOutput = "github_output"
	scratchGitHubEnv    = "github_env"
	// scratchGitHubPath is its $GITHUB_PATH file.
	scratchGitHubPath = "github_path"
	// scratchGitHubSummary and scratchGitHubState are its
	// $GITHUB_STEP_SUMMARY and $GITHUB_STATE files.
	scratchGitHubSummary = "github_step_summary"
	scratchGitHubState   = "github_state"
	// scratchSetupFailure is a Relayer's $STOKE_SETUP_FAILURE file.
	scratchSetupFailure = "setup-failure"
)

// scratchPool is the DirPool of emptied scratch directories, in the
// scratch root (no execution's directory starts with a dot).
const scratchPool = ".pool"

// removeScratch removes an execution's scratch directory. It usually holds
// only its empty tmp and perhaps the outputs file: the file goes by name,
// and the directory with its empty tmp back to the pool for the next
// execution; anything else falls back to the walk.
func (t *Tasks) removeScratch(scratch string) error {
	for _, name := range []string{scratchOutputs, scratchGitHubOutput, scratchGitHubEnv, scratchGitHubPath, scratchGitHubSummary, scratchGitHubState} {
		_ = syscall.Unlink(filepath.Join(scratch, name))
	}
	return t.scratch.Remove(scratch)
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
	r := &pb.StatusResponse{Id: e.id, State: e.state, ExitCode: e.exitCode, BackendSetupFailed: e.setupFailed}
	if !full {
		return r
	}
	r.ErrorMessage = e.errMsg
	r.Outputs = maps.Clone(e.outputs)
	r.Env = maps.Clone(e.exportedEnv)
	r.Summary = e.summary
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
	if err := t.scratch.Close(); err != nil {
		t.log.Warn("removing the pool of scratch directories", "error", err)
	}
}
