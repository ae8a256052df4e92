package runtimed

import (
	"context"
	"fmt"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/runlog"
)

// Exec returns this pod's exec hop: it takes a session into a Run by UID,
// checks that the Run is assigned to this pod and live here — a task while
// it runs, a function while runtimed holds its registration — fills in the
// private registration ID and starts the session on the pod's Runtime
// Server. It can be served over gRPC (exec.NewGRPCServer) or called
// in-process.
func (d *Daemon) Exec() exec.Executor {
	return &execHop{d: d, next: exec.NewGRPCClient(d.cfg.Conn)}
}

// execStartWait bounds how long an exec waits for a Running task's
// execution to start (its source is being materialised).
const execStartWait = 30 * time.Second

// executionID is the Runtime Server's ID of a task attempt's execution:
// one per attempt, so a retried attempt never finds the previous one's,
// and one the Runtime Server files the attempt's output under.
func executionID(uid string, attempt int32) string { return runlog.ExecutionID(uid, attempt) }

type execHop struct {
	d    *Daemon
	next exec.Executor
}

func (h *execHop) Start(ctx context.Context, req exec.Request) (exec.Session, error) {
	if req.RegistrationID != "" {
		return nil, errdefs.InvalidArgument("registration_id", "must be empty at the runtimed hop; runtimed supplies it")
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	h.d.mu.Lock()
	w := h.d.workers[req.RunUID]
	reg := h.d.active[req.RunUID]
	h.d.mu.Unlock()
	if w == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s: not assigned to pod %s", req.RunUID, h.d.cfg.Pod.Name)
	}
	run, deleted := w.current()
	switch {
	case deleted || run.Status.Phase.Terminal():
		return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s has ended", req.RunUID)
	case run.Spec.Mode.Function != nil:
		if reg == nil {
			return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: the function is not registered on pod %s", req.RunUID, h.d.cfg.Pod.Name)
		}
		req.RegistrationID = reg.GetRegistrationId()
	case run.Status.Phase != v1alpha1.PhaseRunning && run.Status.Phase != v1alpha1.PhaseScheduled:
		return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s is %s, not Running", req.RunUID, run.Status.Phase)
	default:
		// Running is recorded before the execution starts: wait for it.
		// Scheduled too: the caller may have seen this worker's own
		// Running write (a watch event can beat the write's answer here),
		// and the execution is this worker's to start.
		t := time.NewTimer(execStartWait)
		defer t.Stop()
		select {
		case <-w.executing:
		case <-ctx.Done():
			return nil, fmt.Errorf("run %s: exec: %w", req.RunUID, ctx.Err())
		case <-t.C:
			return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: its execution has not started within %s", req.RunUID, execStartWait)
		}
		req.RunUID = executionID(req.RunUID, run.Status.Attempt)
	}
	return h.next.Start(ctx, req)
}
