// Package runtime is the adapter-agnostic core of a Runtime Server: it
// validates requests, keeps the table of function registrations with their
// generation fencing, enforces one invocation in flight per registration and
// the invocation bounds, and replaces a warm instance that died. Language
// adapters (internal/runtime/bash, internal/runtime/python) only know how to
// load a handler and run one invocation of it.
package runtime

import (
	"context"
	"log/slog"
	"time"

	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runuser"
)

// Scopes tracks what each task, registration and invocation starts, so
// that nothing outlives it (proc.Subreaper): a process started with
// proc.ScopeEnv=name belongs to scope name between Begin and End, and End
// kills what is left of it that escaped its process group. A nil Scopes
// tracks nothing; process groups are still killed.
type Scopes interface {
	Begin(name string)
	End(name string)
}

// scopeEnv is the environment entry that puts a process in scope name.
func scopeEnv(name string) string { return proc.ScopeEnv + "=" + name }

// Adapter is one language's way of running user code.
type Adapter interface {
	// Name is the runtime's name, e.g. "bash".
	Name() string
	// ValidateHandler checks the handler's syntax without touching the
	// file system. Its error names the problem; the core adds the field.
	ValidateHandler(handler string) error
	// Load starts a warm instance of spec.Handler and returns once it can
	// be invoked. An error is an initialisation failure (missing file,
	// syntax error, missing function, import error) and is reported to
	// runtimed as the registration's fatal_error. ctx bounds initialisation
	// only, not the instance's life.
	Load(ctx context.Context, spec FunctionSpec) (Instance, error)
	// TaskCommand returns the argv of a one-shot execution: entrypoint (a
	// path relative to the working directory, may be empty) and args.
	// timeout is the execution's: the core ends the process at it; an
	// adapter whose task runs elsewhere (Lambda) hands it on, so that the
	// task ends there too.
	TaskCommand(entrypoint string, args []string, timeout time.Duration) ([]string, error)
}

// Relayer is implemented by an adapter whose task command does not run the
// task but relays it to a backend that must first be set up for it (the
// lambda Runtime Server: packaging, CreateFunction). When RelaysTasks is
// true the core names a file in the command's environment
// ($STOKE_SETUP_FAILURE, EnvSetupFailure) where the command writes why that
// setup failed: the task never ran, so the execution ends FAILED with no
// exit code (-1) and backend_setup_failed, an infrastructure failure that
// runtimed retries by default, rather than with the command's exit status
// as if the program had failed. Other adapters' programs never see the
// variable, so they cannot claim the outcome.
type Relayer interface {
	RelaysTasks() bool
}

// TaskPreparer is implemented by an adapter that prepares a task's source
// before its program runs (the Python adapter: the dependencies its
// requirements.txt lists, internal/pydeps; a function's Load does the same
// itself). The core prepares in the background, the execution PENDING
// until the program starts; a failure fails the execution, which never
// ran, with the error's message.
type TaskPreparer interface {
	// TaskNeedsPrepare reports, cheaply, whether the task in dir needs
	// PrepareTask.
	TaskNeedsPrepare(dir string) bool
	// PrepareTask returns the task's environment: env with what the
	// prepared source needs.
	PrepareTask(ctx context.Context, dir string, env []string) ([]string, error)
}

// SpareKeeper is implemented by an adapter that starts an instance's
// process before its registration arrives (the Python adapter: a spare
// interpreter idle on its request pipe, handed the next registration), so
// that the process's own start leaves the registration's path. NewFunctions
// calls KeepSpare once; Functions.Close calls CloseSpare, after which no
// spare is left running or made.
type SpareKeeper interface {
	KeepSpare(spec SpareSpec)
	CloseSpare()
}

// SpareSpec is what a spare is started with: what every registration of
// the server shares.
type SpareSpec struct {
	// Env is the environment of a registration with no env of its own,
	// without HOME and TMPDIR (each Run's own): an adapter compares with
	// it what the process reads at its start.
	Env []string
	// User is every registration's user (FunctionSpec.User).
	User   *runuser.User
	Scopes Scopes       // nil: none
	Logger *slog.Logger // the server's events
}

// AgentReporter is implemented by an adapter whose tasks run elsewhere and
// are reached for exec through a reverse agent (the lambda Runtime
// Server). An execution's Status and Wait then carry agent_connected, and
// Wait answers when it changes, so that runtimed shows it on the Run.
type AgentReporter interface {
	// TaskAgent reports whether the agent of the task whose working
	// directory is dir is connected now, and a channel closed at the next
	// change of any agent's state (a wake-up may change nothing of dir's).
	TaskAgent(dir string) (connected bool, changed <-chan struct{})
}

// EnvSetupFailure names the file of a Relayer's task command (see
// Relayer).
const EnvSetupFailure = "STOKE_SETUP_FAILURE"

// FunctionSpec is what an adapter needs to load one function.
type FunctionSpec struct {
	RunUID     string
	WorkingDir string // absolute, inside the workspace root, exists
	Handler    string // syntax already validated by the adapter
	// Env is the complete environment for handler processes ("K=V"): the
	// minimal base plus the registration's env. Never the server's own.
	Env []string
	// ScratchDir is a private, empty directory owned by this instance for
	// pipes and request files; removed by the core after Close. With a
	// User it is a passage (runuser.User.Passage): what the handler's
	// processes use in it, the adapter makes and hands to User.
	ScratchDir string
	// User, when set, is the unprivileged user the handler's processes
	// run as (proc.AsUser); nil: as this process. WorkingDir is the
	// user's already.
	User   *runuser.User
	Logger *slog.Logger // carries run_uid; for events, never output
	// Output receives the handler's output (Bash: stderr; Python: what it
	// prints and its stderr), with the invocation it belongs to.
	Output Output
}

// Output receives one Run's program output a line at a time: its log,
// never the server's own. Line files a line without its newline; Flush
// writes what is buffered, and is called by a pump before it waits for
// more (loglines.PumpFlush), so that no line waits in a buffer while the
// program is quiet. *runlog.Sink implements it.
type Output interface {
	// Line files one line of stream ("stdout" or "stderr") of the
	// invocation invocationID, "" outside invocations.
	Line(stream, invocationID string, line []byte)
	Flush()
}

// DiscardOutput drops every line, for a FunctionSpec without Output.
var DiscardOutput Output = discardOutput{}

type discardOutput struct{}

func (discardOutput) Line(string, string, []byte) {}
func (discardOutput) Flush()                      {}

// Invocation is one call of a loaded function.
type Invocation struct {
	ID       string
	RunUID   string
	Input    []byte // valid JSON, at most bounds.InvokeBody
	Deadline time.Time
	// Scope is the value of proc.ScopeEnv for the processes the call
	// starts, so that any it leaves behind are traced to it and killed;
	// "" when the server tracks no scopes.
	Scope string
}

// Result is what a successful invocation returns.
type Result struct {
	Output  []byte            // the handler's result, expected to be JSON
	Outputs map[string]string // validated by the core
}

// Instance is one warm, loaded function. The core never calls Invoke
// concurrently on one instance.
type Instance interface {
	// Invoke runs one invocation. A failure of user code is an
	// *errdefs.FunctionError. When ctx ends first, Invoke kills the
	// invocation's processes before it returns ctx's error. ctx is the
	// call's until Invoke returns (the core reuses it for the next call):
	// what is derived from it or registered on it (AfterCall) must be
	// cancelled or stopped by then; it carries no values.
	Invoke(ctx context.Context, inv Invocation) (Result, error)
	// Done is closed when the instance can no longer serve (its process
	// died or was killed); the core then replaces it with a new Load.
	Done() <-chan struct{}
	// Close kills every process of the instance. Safe to call twice.
	Close() error
}

// A Finisher is an Instance that leaves part of each call to Finish: what
// only keeps the next call clean (the kill of what the call started and
// left running), which need not hold up the call's answer. The core calls
// Finish once after every Invoke that returned, after the answer is
// handed to the transport and before the next Invoke; an Invoke that
// finds the last call not finished finishes it first.
type Finisher interface {
	Finish()
}
