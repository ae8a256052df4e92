// Package exec is the core of exec into a live Run: an Executor starts a
// command in a Run's working directory and environment and a Session streams
// its stdin, stdout and stderr with end-to-end flow control (a slow reader
// blocks the command on its pipe; nothing is dropped or reordered), resizes
// its terminal, signals it and reports its exit.
//
// Every hop is an Executor: Local runs the command on the Runtime Server;
// NewGRPCClient speaks the executor.v1 Exec stream to a Runtime Server (or to
// runtimed's hop), and ServeGRPC serves one over any Executor. Package
// internal/exec/channel speaks Kubernetes' v5.channel.k8s.io WebSocket
// protocol on both sides. Package internal/exec/exectest is the one suite
// each of them passes.
package exec

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// TaskPIDEnv names, in the environment of an exec session into a running
// task, the task's process ID, which leads its process group: `kill -s
// SIG -- -$STOKE_TASK_PID` signals the task (`docker kill -s`).
const TaskPIDEnv = "STOKE_TASK_PID"

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Width, Height uint16
}

// Request is what starts one exec session.
type Request struct {
	// RunUID names the Run; RegistrationID, for a function on a Runtime
	// Server, its current registration (empty at runtimed's hop and the
	// gateway, which fill it in).
	RunUID         string
	RegistrationID string
	// Command is argv, executed directly, argv[0] resolved on the Run's
	// PATH.
	Command []string
	TTY     bool
	// Stdin attaches the command's stdin; without it stdin is /dev/null.
	Stdin bool
	// Size is the terminal's initial size (TTY only; zero: 80×24).
	Size TermSize
	// Env is added to the Run's environment.
	Env map[string]string
	// Attach joins the task's own process instead of starting Command
	// (which, like Env, must then be empty): its output from now on, plus
	// what it wrote before the first attach (bounded), Stdin to its stdin,
	// Resize to its terminal, Signal to its process group, and its exit.
	// The task must have been started with stdin or a terminal
	// (ExecuteRequest's stdin, tty); TTY is then the task's, and Size,
	// when set, resizes its terminal before Start returns.
	Attach bool
	// StdinOnce (Attach only): stdin's EOF closes the task's stdin (with
	// a TTY, sends ^D), as Docker's StdinOnce; otherwise it only detaches
	// this session's stdin, and the task's stays open for the next.
	StdinOnce bool
	// ControlOnly (Attach only): the session takes no output, only
	// resizes or signals: what the task wrote before the first attach is
	// left to the first session that takes output.
	ControlOnly bool
}

// Validate checks the request's syntax; its errors are InvalidArgument.
func (r Request) Validate() error {
	switch {
	case r.RunUID == "":
		return errdefs.InvalidArgument("run_uid", "must not be empty")
	case len(r.RunUID) > bounds.RunUID:
		return errdefs.InvalidArgument("run_uid", "is %d bytes, at most %d allowed", len(r.RunUID), bounds.RunUID)
	case r.Attach && len(r.Command) > 0:
		return errdefs.InvalidArgument("command", "must be empty when attaching to the task's own process")
	case r.Attach && len(r.Env) > 0:
		return errdefs.InvalidArgument("env", "must be empty when attaching to the task's own process")
	case r.Attach:
		return nil
	case r.StdinOnce || r.ControlOnly:
		return errdefs.InvalidArgument("stdin_once", "stdin_once and control_only apply to an attach session only")
	case len(r.Command) == 0 || r.Command[0] == "":
		return errdefs.InvalidArgument("command", "must not be empty")
	case len(r.Command) > bounds.Args:
		return errdefs.InvalidArgument("command", "%d entries, at most %d allowed", len(r.Command), bounds.Args)
	}
	for i, a := range r.Command {
		field := fmt.Sprintf("command[%d]", i)
		if len(a) > bounds.Arg {
			return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(a), bounds.Arg)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.InvalidArgument(field, "contains a NUL byte")
		}
	}
	return validation.Env("env", r.Env)
}

// Exit is how a command ended.
type Exit struct {
	// Code is the exit status; 128+Signal when a signal ended it, 126
	// when it could not be executed, 127 when it was not found.
	Code int
	// Signal is the signal that ended the command, or 0.
	Signal int
}

// Streams are a session's ends on the caller's side. Writes to Stdout and
// Stderr happen in order, each from one goroutine; a Write that blocks holds
// back the command (it blocks on its pipe) and never loses a byte.
type Streams struct {
	// Stdin is copied to the command until EOF, which closes the
	// command's stdin (with a TTY: sends the terminal's EOF character).
	// nil when the request has no stdin.
	Stdin io.Reader
	// Stdout receives stdout (with a TTY, the terminal's output).
	Stdout io.Writer
	// Stderr receives stderr; unused with a TTY.
	Stderr io.Writer
}

// BuffersWriter is implemented by a Streams writer that takes one write in
// pieces, as writev does: a frame that arrives in pieces (grpc-go's receive
// buffers) is passed on whole without being copied together first. The
// pieces are valid only during the call.
type BuffersWriter interface {
	io.Writer
	WriteBuffers(pieces [][]byte) (int, error)
}

// Executor starts exec sessions. Its errors are errdefs categories:
// InvalidArgument, NotFound (no such Run here), NotRunning or
// FailedPrecondition (the Run ended, a stale registration),
// ResourceExhausted (a session limit), Unavailable.
type Executor interface {
	// Start starts the command and returns once it runs (or is known
	// not to exist: its Stream then reports 127). ctx bounds the start
	// only.
	Start(ctx context.Context, req Request) (Session, error)
}

// Session is one started exec session. Its owner calls Close.
type Session interface {
	// Stream copies until the command has exited and all its output was
	// written, and returns its exit. When the session is ended first —
	// its Run ended, its registration was replaced, ctx ended, Close —
	// its processes are killed and Stream returns an error saying why.
	// Stream does not wait for a Read of Stdin that blocks. Call it once.
	Stream(ctx context.Context, s Streams) (Exit, error)
	// Pid is the command's process ID where it runs (the Runtime
	// Server's), 0 when it could not be started or a hop does not say
	// (Kubernetes' exec protocol has no such field).
	Pid() int
	// Resize sets the terminal's size; without a TTY it does nothing.
	Resize(TermSize) error
	// Signal sends sig to the command's process group (with a TTY, the
	// terminal's foreground group).
	Signal(sig syscall.Signal) error
	// Close ends the session, killing every process it started, and
	// frees its slot. Safe to call twice and after Stream.
	Close() error
}
