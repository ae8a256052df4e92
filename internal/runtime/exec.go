package runtime

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// ExecTarget finds a running execution for an exec session into it: its
// working directory, environment, and a channel closed when it ends.
func (t *Tasks) ExecTarget(id string) (exec.Target, error) {
	e, err := t.lookup(id)
	if err != nil {
		return exec.Target{}, err
	}
	if e.isTerminal() {
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: its execution has finished", id)
	}
	e.mu.Lock()
	env := e.env
	if e.pid > 0 {
		// The task leads its process group: `kill -s SIG -- -$STOKE_TASK_PID`
		// in a session signals it (`docker kill -s`).
		env = append(slices.Clip(env), exec.TaskPIDEnv+"="+strconv.Itoa(e.pid))
	}
	attach := e.attach
	e.mu.Unlock()
	return exec.Target{
		Dir: e.dir, Env: env, Ended: e.done, Attach: attach,
		Reason: func() string {
			e.mu.Lock()
			defer e.mu.Unlock()
			return fmt.Sprintf("its execution ended (%s)", stateLabel(e.state))
		},
	}, nil
}

// ExecTarget finds a registration, in any state but gone, for an exec
// session into it; a stale registration ID is FailedPrecondition. The
// target ends when the registration is released or replaced.
func (f *Functions) ExecTarget(ref *pb.FunctionRegistration) (exec.Target, error) {
	r, err := f.lookup(ref)
	if err != nil {
		return exec.Target{}, err
	}
	if r.ctx.Err() != nil {
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: its registration is being released", r.uid)
	}
	return exec.Target{
		Dir: r.spec.WorkingDir, Env: r.spec.Env, Ended: r.ctx.Done(),
		Reason: func() string { return "its function registration was released or replaced" },
	}, nil
}

// ExecTargets resolves exec sessions on a Runtime Server: a task execution
// by Run UID, or, with a registration ID, a function registration.
func ExecTargets(tasks *Tasks, fns *Functions) exec.Targets {
	return execTargets{tasks: tasks, fns: fns}
}

type execTargets struct {
	tasks *Tasks
	fns   *Functions
}

func (t execTargets) ExecTarget(runUID, registrationID string) (exec.Target, error) {
	if registrationID != "" {
		if t.fns == nil {
			return exec.Target{}, errdefs.Errorf(errdefs.ErrNotFound, "run %s: this runtime server has no functions", runUID)
		}
		return t.fns.ExecTarget(&pb.FunctionRegistration{RunUid: runUID, RegistrationId: registrationID})
	}
	if t.tasks == nil {
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotFound, "run %s: no execution (a function needs its registration_id)", runUID)
	}
	target, err := t.tasks.ExecTarget(runUID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotFound, "run %s: no execution here (a function needs its registration_id)", runUID)
	}
	return target, err
}
