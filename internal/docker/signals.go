package docker

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/events"
	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/podcopy"
)

// defaultStopTimeout is Docker's: how long `docker stop` waits after the
// stop signal before it kills.
const defaultStopTimeout = 10

// parseSignal reads Docker's signal: a number, or a name with or without
// SIG ("USR1", "SIGUSR1").
func parseSignal(s string) (syscall.Signal, error) {
	if s == "" {
		return syscall.SIGKILL, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, errdefs.InvalidArgument("signal", "%d is not a signal", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, errdefs.InvalidArgument("signal", "invalid signal: %s", bounds.Truncate(s, bounds.Quoted))
	}
	return sig, nil
}

// signalScript signals the task's process group from an exec session into
// its Run: the Runtime Server names the task's PID in the session's
// environment (exec.TaskPIDEnv). The signal is an argument, never
// part of the script.
const signalScript = `exec kill -s "$1" -- "$2$` + exec.TaskPIDEnv + `"`

// signal sends sig to a running container's task through the Exec
// service, as `stoke exec` reaches it (local pods, Kubernetes, Lambda).
func (s *Server) signal(ctx context.Context, c *ctr, sig syscall.Signal) error {
	if !c.running() {
		return errdefs.Errorf(errdefs.ErrNotRunning, "Cannot kill container: %s: container %s is not running", c.name, c.id)
	}
	if s.onLambda(c) {
		return lambdaSignal(c, sig)
	}
	name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
	if name == "" {
		name = strconv.Itoa(int(sig))
	}
	code, out, err := s.run(ctx, c, []string{"sh", "-c", signalScript, "kill", name}, nil)
	if err != nil {
		return err
	}
	if code != 0 {
		return errdefs.Errorf(errdefs.ErrNotRunning, "Cannot kill container: %s: the task did not take signal %s: %s", c.name, name, bounds.Truncate(strings.TrimSpace(string(out)), bounds.Quoted*4))
	}
	return nil
}

// run runs argv in the container's Run through the Exec service and
// returns its exit status and its output (bounded), stdin from in.
func (s *Server) run(ctx context.Context, c *ctr, argv []string, in *bytes.Reader) (int, []byte, error) {
	x, uid, err := s.cfg.Backend.ExecRoute(c.run.Namespace, c.run.Name)
	if err != nil {
		return 0, nil, err
	}
	sess, err := x.Start(ctx, exec.Request{RunUID: uid, Command: argv, Stdin: in != nil})
	if err != nil {
		return 0, nil, err
	}
	defer sess.Close()
	var out podcopy.Buffer
	streams := exec.Streams{Stdout: &out, Stderr: &out}
	if in != nil {
		streams.Stdin = in
	}
	exit, err := sess.Stream(ctx, streams)
	if err != nil {
		return 0, nil, err
	}
	return exit.Code, out.Bytes(), nil
}

func (s *Server) containerKill(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	sig, err := parseSignal(r.URL.Query().Get("signal"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !c.running() {
		writeError(w, errdefs.Errorf(errdefs.ErrNotRunning, "Cannot kill container: %s: container %s is not running", c.name, c.id))
		return
	}
	// Before the signal, whose die may come first otherwise.
	s.event(c, events.ActionKill, map[string]string{"signal": strconv.Itoa(int(sig))})
	if err := s.kill(r.Context(), c, sig); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// kill delivers sig; SIGKILL (or a task not started yet, which no signal
// reaches) also cancels the Run, so that it ends even where the signal
// could not be delivered.
func (s *Server) kill(ctx context.Context, c *ctr, sig syscall.Signal) error {
	if sig == syscall.SIGKILL && s.onLambda(c) {
		// No exec session into the sandbox: the cancel ends it.
		_, err := s.cfg.Backend.CancelRun(ctx, c.run.Namespace, c.run.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			err = nil
		}
		return err
	}
	err := s.signal(ctx, c, sig)
	if sig == syscall.SIGKILL || (err != nil && (sig == syscall.SIGTERM || sig == syscall.SIGINT)) {
		if _, cerr := s.cfg.Backend.CancelRun(ctx, c.run.Namespace, c.run.Name); cerr != nil && !errors.Is(cerr, errdefs.ErrNotFound) {
			return cerr
		}
		return nil
	}
	return err
}

func (s *Server) containerStop(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !c.running() {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if err := s.stop(r, c); err != nil {
		writeError(w, err)
		return
	}
	s.event(c, events.ActionStop, nil)
	w.WriteHeader(http.StatusNoContent)
}

// stop sends the stop signal, waits up to the timeout for the task to
// end, then kills it, and waits for its end.
func (s *Server) stop(r *http.Request, c *ctr) error {
	q := r.URL.Query()
	timeout := defaultStopTimeout
	if c.meta.StopTimeout != nil {
		timeout = *c.meta.StopTimeout
	}
	if t := q.Get("t"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < -1 {
			return errdefs.InvalidArgument("t", "must be a number of seconds")
		}
		timeout = n
	}
	sig := syscall.SIGTERM
	if name := q.Get("signal"); name != "" || c.meta.StopSignal != "" {
		if name == "" {
			name = c.meta.StopSignal
		}
		var err error
		if sig, err = parseSignal(name); err != nil {
			return err
		}
	}
	ctx := r.Context()
	if s.onLambda(c) {
		timeout = 0 // no signal but SIGKILL reaches a Lambda task
	} else if err := s.signal(ctx, c, sig); err != nil && errdefs.HTTPStatus(err) != http.StatusConflict {
		s.log.Info("docker: stop signal not delivered; killing", "container", c.id[:12], "error", err)
	}
	if timeout >= 0 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(timeout)*time.Second)
		_, _ = s.waitFor(wctx, c, conditionNotRunning)
		cancel()
	} else {
		_, _ = s.waitFor(ctx, c, conditionNotRunning)
	}
	if cur, err := s.lookup(c.id); err == nil && cur.running() {
		if err := s.kill(ctx, cur, syscall.SIGKILL); err != nil {
			return err
		}
		_, _ = s.waitFor(ctx, cur, conditionNotRunning)
	}
	return nil
}

func (s *Server) containerRestart(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if c.running() {
		if err := s.stop(r, c); err != nil {
			writeError(w, err)
			return
		}
	}
	if c.run != nil {
		// A task Run runs once: restart is a new Run with the same ID and
		// name, once the old one is deleted.
		if err := s.remove(r, c); err != nil {
			writeError(w, err)
			return
		}
		if err := s.awaitGone(r.Context(), c); err != nil {
			writeError(w, err)
			return
		}
		c = &ctr{id: c.id, name: c.name, meta: c.meta, env: c.env, runtime: c.runtime}
	}
	run, err := s.start(r, c)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.awaitStarted(r.Context(), run); err != nil {
		writeError(w, err)
		return
	}
	s.event(c, events.ActionRestart, nil)
	w.WriteHeader(http.StatusNoContent)
}

// awaitGone waits until the container's Run is deleted from the store.
func (s *Server) awaitGone(ctx context.Context, c *ctr) error {
	for {
		ch := s.changes()
		if _, err := s.cfg.Backend.GetRun(ctx, c.run.Namespace, c.run.Name); errors.Is(err, errdefs.ErrNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-time.After(250 * time.Millisecond):
		}
	}
}
