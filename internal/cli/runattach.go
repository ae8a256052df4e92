package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/term"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// interactive sets up `stoke run -i/-t` as `docker run -i/-t` does: the
// task is created with spec.mode.task.stdin/tty. Without a terminal on
// stdin, -t with -i is dropped with a note, as stoke exec does.
func interactive(run *v1alpha1.Run, opts *RunOptions, s Streams) {
	if !opts.Stdin && !opts.TTY {
		return
	}
	if opts.TTY && opts.Stdin && !isTerminal(s.In) {
		s.note("stdin is not a terminal: running without a TTY")
		opts.TTY = false
	}
	if run.Spec.Mode.Task != nil {
		run.Spec.Mode.Task.Stdin, run.Spec.Mode.Task.TTY = opts.Stdin, opts.TTY
	}
}

func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// attachTask joins a created task's own process through the Exec
// service's attach mode (the exec endpoint's attach=true, what `docker
// attach` uses, on `stoke up` and through a cluster's gateway) and returns
// the Run once terminal. Stdin goes to the task, and its EOF closes the
// task's stdin (StdinOnce, as `docker run -i`; with a terminal, ^D).
//
// With -t the task's terminal is this one: its output comes through the
// session raw, from its start (the first session gets what the task wrote
// before it joined), the local terminal is raw while stdin is one, and its
// window size follows (SIGWINCH). Without -t the session carries stdin
// only, and the output, stdout and stderr apart and whole, comes from the
// Run's log as without -i. A task that ended before a session joined it is
// followed through its log.
func attachTask(ctx context.Context, c client.API, run *v1alpha1.Run, opts RunOptions, s Streams) (*v1alpha1.Run, error) {
	req := exec.Request{RunUID: run.Namespace + "/" + run.Name, Attach: true, Stdin: opts.Stdin, StdinOnce: opts.Stdin, TTY: opts.TTY, ControlOnly: !opts.TTY}
	if req.TTY && isTerminal(s.Out) {
		f := s.Out.(*os.File)
		if w, h, err := term.GetSize(int(f.Fd())); err == nil {
			req.Size = exec.TermSize{Width: uint16(w), Height: uint16(h)}
		}
	}
	sess, err := joinTask(ctx, c, run, req)
	if err != nil {
		return nil, fmt.Errorf("attaching to the task: %w", err)
	}
	if sess == nil {
		return followTask(ctx, c, run, opts, s)
	}
	defer sess.Close()
	streams := exec.Streams{}
	if req.Stdin {
		streams.Stdin = s.In
	}
	if !req.TTY {
		// Stdin only, until the task ends; the log has the output.
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = sess.Stream(sctx, streams)
		}()
		final, err := followTask(ctx, c, run, opts, s)
		cancel()
		<-done
		return final, err
	}
	if req.Stdin && isTerminal(s.In) {
		in := s.In.(*os.File)
		state, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return nil, fmt.Errorf("raw terminal: %w", err)
		}
		defer func() { _ = term.Restore(int(in.Fd()), state) }()
	}
	stop := followWindow(ctx, sess, s.Out)
	defer stop()
	streams.Stdout = s.Out
	if _, err := sess.Stream(ctx, streams); err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrNotRunning) {
		return nil, fmt.Errorf("attach session: %w", err)
	}
	// The Run says how the task ended (a timeout, a failure).
	return waitRun(ctx, c, run.Namespace, run.Name, string(run.UID), terminal)
}

// joinTask starts the attach session, waiting while the task is on its
// way to running (Pending, Scheduled; a gateway's informer a moment
// behind). It returns no session when the task ended first.
func joinTask(ctx context.Context, c client.API, run *v1alpha1.Run, req exec.Request) (exec.Session, error) {
	for {
		cur, err := waitRun(ctx, c, run.Namespace, run.Name, string(run.UID), func(r *v1alpha1.Run) bool {
			return terminal(r) || r.Status.Phase == v1alpha1.PhaseRunning
		})
		if err != nil {
			return nil, err
		}
		if terminal(cur) {
			return nil, nil
		}
		sess, err := c.Exec().Start(ctx, req)
		if err == nil {
			return sess, nil
		}
		if !errors.Is(err, errdefs.ErrNotRunning) && !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(joinRecheck):
		}
	}
}

// joinRecheck is how soon a join refused while the Run shows Running is
// tried again (the route to its pod may lag the Run by a moment).
const joinRecheck = 50 * time.Millisecond
