package runtime

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/proc"
)

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
	// setupFailure is a Relayer's $STOKE_SETUP_FAILURE file, "" otherwise.
	setupFailure string
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
	path, err := proc.LookPath(l.argv[0], l.dir, l.envPath)
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
	var opts []proc.Option
	if t.cfg.Cgroup != nil {
		cg, err := t.cfg.Cgroup.Child(e.scope)
		var dir *os.File
		if err == nil {
			e.cgroup = cg // removed by finish, also when nothing starts
			dir, err = cg.Open()
		}
		if err != nil {
			closeAll(outR, outW, errR, errW)
			fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: cgroup: "+err.Error())
			return
		}
		defer dir.Close()
		opts = append(opts, proc.InCgroup(int(dir.Fd())))
	}
	p, err := proc.Start(cmd, append(opts, proc.AsUser(t.cfg.User.Credential()))...)
	closeAll(outW, errW) // the child has its copies; EOF needs ours closed
	if err != nil {
		closeAll(outR, errR)
		fail(pb.ExecutionState_EXECUTION_STATE_FAILED, "start: "+err.Error())
		return
	}
	started := time.Now()
	e.mu.Lock()
	e.state = pb.ExecutionState_EXECUTION_STATE_RUNNING
	e.pid = p.Pid()
	e.mu.Unlock()
	e.log.Info("execution started", "pid", p.Pid(), "command", l.argv[0], "timeout", e.timeout)
	go t.supervise(e, p, outR, errR, l, started)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
