package runtime

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"syscall"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	stokeexec "stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/proc"
)

// SelfCommand is the command name that runs the runtime server's own
// executable (TasksConfig.Self): `stoke hash-files ...`.
const SelfCommand = "stoke"

// launch is what starting an execution needs, resolved by Execute.
type launch struct {
	argv    []string
	dir     string
	envPath string // the child's PATH, to resolve argv[0] in
	env     []string
	outputs string // the $STOKE_OUTPUTS file
	// githubOutput and githubEnv are the $GITHUB_OUTPUT and $GITHUB_ENV
	// files (GitHub Actions' file commands, for steps copied from a
	// GitHub workflow).
	githubOutput, githubEnv string
	// githubPath is the $GITHUB_PATH file: directories later steps find
	// first on PATH (collected into the exported env's PATH).
	githubPath string
	// githubSummary and githubState are the $GITHUB_STEP_SUMMARY and
	// $GITHUB_STATE files (docs/runs.md).
	githubSummary, githubState string
	// setupFailure is a Relayer's $STOKE_SETUP_FAILURE file, "" otherwise.
	setupFailure string
	// stdin and tty: the task keeps a stdin pipe, or runs on a terminal,
	// for attach sessions (ExecuteRequest's stdin and tty).
	stdin, tty bool
	// size is the terminal's at the start (tty_size; zero: 80×24).
	size stokeexec.TermSize
}

// taskEnv builds the child's environment: the minimal base, the request's
// env on top, and $STOKE_OUTPUTS, $GITHUB_OUTPUT and $GITHUB_ENV last,
// because the server decides where it reads them from. It also returns the child's PATH.
func taskEnv(base, env map[string]string, l *launch) ([]string, string) {
	extra := maps.Clone(env)
	if extra == nil {
		extra = map[string]string{}
	}
	extra["STOKE_OUTPUTS"] = l.outputs
	if l.githubOutput != "" {
		extra["GITHUB_OUTPUT"], extra["GITHUB_ENV"] = l.githubOutput, l.githubEnv
		if l.githubPath != "" {
			extra["GITHUB_PATH"] = l.githubPath
		}
		if l.githubSummary != "" {
			extra["GITHUB_STEP_SUMMARY"], extra["GITHUB_STATE"] = l.githubSummary, l.githubState
		}
	}
	path := base["PATH"]
	if p, ok := extra["PATH"]; ok {
		path = p
	}
	return MergeEnv(base, extra), path
}

// prepareAndStart has the adapter prepare e's source (TaskPreparer),
// within e's timeout and until it is cancelled, then starts it; a failed
// preparation fails e, which never ran.
func (t *Tasks) prepareAndStart(e *execution, l launch, tp TaskPreparer) {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	go func() {
		select {
		case <-e.cancelled:
		case <-t.closing:
		case <-ctx.Done():
		}
		cancel()
	}()
	env, err := tp.PrepareTask(ctx, l.dir, l.env)
	if err != nil {
		select {
		case <-e.cancelled:
		case <-t.closing:
		default:
			t.finish(e, pb.ExecutionState_EXECUTION_STATE_FAILED, noExitCode, "prepare: "+err.Error(), results{})
			t.wg.Done()
			return
		}
	}
	if err == nil {
		l.env = env
	}
	t.start(e, l) // finishes e as cancelled, if it was
}

// start starts e's process and hands it to a supervisor; t.wg was added
// for e, and is released here when nothing starts.
func (t *Tasks) start(e *execution, l launch) {
	fail := func(state pb.ExecutionState, msg string) {
		t.finish(e, state, noExitCode, msg, results{})
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
	path, err := t.cfg.Self, error(nil)
	if l.argv[0] != SelfCommand || path == "" {
		path, err = proc.LookPath(l.argv[0], l.dir, l.envPath)
	}
	if err != nil {
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	cmd := &exec.Cmd{Path: path, Args: l.argv, Dir: l.dir, Env: l.env}
	stdio, err := t.taskStdio(cmd, l)
	if err != nil {
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	var opts []proc.Option
	if l.tty {
		// The task leads a new session whose controlling terminal is the
		// PTY (its fd 0): ^C in the byte stream reaches its foreground
		// group, and its group is still the task's pid.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setctty: true, Ctty: 0}
		opts = append(opts, proc.NewSession())
	}
	if t.cfg.Cgroup != nil {
		cg, err := t.cfg.Cgroup.Child(e.scope)
		var dir *os.File
		if err == nil {
			e.cgroup = cg // removed by finish, also when nothing starts
			dir, err = cg.Open()
		}
		if err != nil {
			stdio.closeAll()
			fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: cgroup: "+err.Error())
			return
		}
		defer dir.Close()
		opts = append(opts, proc.InCgroup(int(dir.Fd())))
	}
	p, err := proc.Start(cmd, append(opts, proc.AsUser(t.cfg.User.Credential()))...)
	closeAll(stdio.childEnds...) // the child has its copies; EOF needs ours closed
	if err != nil {
		closeAll(stdio.outR, stdio.errR, stdio.stdin)
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	var attach *stokeexec.Attachment
	if stdio.stdin != nil {
		attach = stokeexec.NewAttachment(p.Pid(), stdio.stdin, l.tty)
	}
	started := time.Now()
	e.mu.Lock()
	e.state = pb.ExecutionState_EXECUTION_STATE_RUNNING
	e.pid = p.Pid()
	e.attach = attach
	e.mu.Unlock()
	e.log.Info("execution started", "pid", p.Pid(), "command", l.argv[0], "timeout", e.timeout)
	go t.supervise(e, p, stdio, attach, l, started)
}

// taskIO is a task's ends of its stdio: the output's read ends (with a
// terminal, outR is its master and errR nil), stdin's write end (the
// master with a terminal; nil without stdin) and the child's ends, closed
// once it started.
type taskIO struct {
	outR, errR, stdin *os.File
	childEnds         []*os.File
}

func (stdio taskIO) closeAll() {
	closeAll(append([]*os.File{stdio.outR, stdio.errR, stdio.stdin}, stdio.childEnds...)...)
}

// taskStdio makes cmd's stdio: our own pipes rather than exec's copying
// goroutines (the child's exit is then observed independently of a
// background job that still holds the write end, and the pumps always
// drain them), or a terminal. Stdin is /dev/null unless the task keeps
// one (a task never waits for input it cannot get).
func (t *Tasks) taskStdio(cmd *exec.Cmd, l launch) (taskIO, error) {
	var stdio taskIO
	if l.tty {
		master, tty, err := stokeexec.OpenPTY(l.size)
		if err != nil {
			return stdio, err
		}
		// As login does: the terminal is its user's.
		if err := t.cfg.User.GiveFile(tty); err != nil {
			closeAll(master, tty)
			return stdio, fmt.Errorf("terminal: %w", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		stdio.outR, stdio.stdin, stdio.childEnds = master, master, []*os.File{tty}
		return stdio, nil
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return stdio, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		return stdio, fmt.Errorf("stderr pipe: %w", err)
	}
	stdio.outR, stdio.errR, stdio.childEnds = outR, errR, []*os.File{outW, errW}
	cmd.Stdout, cmd.Stderr = outW, errW
	if l.stdin {
		r, w, err := os.Pipe()
		if err != nil {
			stdio.closeAll()
			return taskIO{}, fmt.Errorf("stdin pipe: %w", err)
		}
		cmd.Stdin, stdio.stdin = r, w
		stdio.childEnds = append(stdio.childEnds, r)
	}
	return stdio, nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
