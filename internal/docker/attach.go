package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// containerAttach hijacks the connection and streams the container's
// output until it ended (a created container's once it is started: the
// CLI attaches before `docker run` starts the container). A container
// created with a TTY or OpenStdin is joined through an attach session of
// the Exec service (stdin in, its output out, with what it wrote before
// the first attach); one without, and one whose task ended before the
// session could join, is streamed from its Run's log from its start.
// With a TTY the detach keys (detachKeys, detach.go) end the stream, the
// process running on.
func (s *Server) containerAttach(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	flag := func(k string) bool { v, _ := strconv.ParseBool(q.Get(k)); return v }
	stdin := flag("stdin")
	switch {
	case stdin && !c.meta.OpenStdin:
		writeError(w, errdefs.InvalidArgument("stdin", "container %s was created without stdin open (-i): its process has none to attach", c.id[:12]))
		return
	case c.run != nil && c.run.Status.Phase.Terminal() && !flag("logs"):
		// Docker's CLI says so itself before it attaches; an API client
		// gets it here, before the hijack.
		writeError(w, errdefs.Errorf(errdefs.ErrConflict, "You cannot attach to a stopped container, start it first"))
		return
	}
	keys, err := parseDetachKeys(q.Get("detachKeys"))
	if err != nil {
		writeError(w, err)
		return
	}
	lq := logQuery{tail: -1, stdout: q.Get("stdout") != "0" && q.Get("stdout") != "false", stderr: q.Get("stderr") != "0" && q.Get("stderr") != "false"}
	if err := checkUpgrade(r); err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	s.attached[c.id]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.attached[c.id]--; s.attached[c.id] <= 0 {
			delete(s.attached, c.id)
		}
		s.mu.Unlock()
		if cur, err := s.lookup(c.id); err == nil && cur.run != nil {
			s.autoRemove(s.serverCtx(), cur.run)
		}
	}()
	conn, in, err := hijack(w, c.meta.Tty)
	if err != nil {
		s.log.Info("docker: attach hijack failed", "container", c.id[:12], "error", err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(s.serverCtx())
	defer cancel()
	// Until started.
	for c.run == nil {
		ch := s.changes()
		cur, err := s.lookup(c.id)
		if err != nil {
			return
		}
		if c = cur; c.run != nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-time.After(waitRecheck):
		}
	}
	var stdout, stderr io.Writer = conn, io.Discard
	if !c.meta.Tty {
		stdout, stderr = newFramed(conn)
	}
	if !lq.stdout {
		stdout = io.Discard
	}
	if !lq.stderr || c.meta.Tty {
		stderr = io.Discard
	}
	if c.meta.Tty || c.meta.OpenStdin {
		// As Docker: with StdinOnce and no TTY, stdin's EOF closes the
		// process's stdin and the output goes on to its end; otherwise
		// EOF ends this attach (the process goes on), and with a TTY
		// so do the detach keys, which are not passed on.
		actx, detach := context.WithCancel(ctx)
		defer detach()
		var in io.Reader = in
		switch {
		case !stdin:
			in = nil
		case c.meta.Tty:
			in = newDetachingStdin(in, keys, detach)
		case !c.meta.StdinOnce:
			in = newDetachingStdin(in, nil, detach)
		}
		if s.attachProcess(actx, c, in, stdout, stderr) || actx.Err() != nil {
			return
		}
	}
	if !lq.stdout && !lq.stderr {
		_, _ = s.waitFor(ctx, c, conditionNextExit)
		return
	}
	lq.stdout, lq.stderr = true, true
	if _, err := s.copyLog(ctx, c, lq, true, 0, stdout, stderr); err != nil && ctx.Err() == nil {
		s.log.Info("docker: attach ended early", "container", c.id[:12], "error", err)
	}
}

// attachProcess joins the container's task through an attach session and
// streams it until the task ended. It reports false when no session could
// join, the task having ended (its log has the output) or never had stdin
// or a terminal: the caller then streams the log.
func (s *Server) attachProcess(ctx context.Context, c *ctr, stdin io.Reader, stdout, stderr io.Writer) bool {
	sess, err := s.joinTask(ctx, c, stdin != nil, exec.TermSize{}, false)
	if err != nil {
		s.log.Info("docker: attach: streaming the log instead", "container", c.id[:12], "error", err)
		return false
	}
	defer sess.Close()
	_, err = sess.Stream(ctx, exec.Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	switch {
	case err == nil:
		// The task ended. Where the Runs in memory are an informer's
		// (Kubernetes) its Run shows so a moment later, and a client
		// that inspects the container once the stream ends (for
		// attach's exit code) must find it exited: the stream ends when
		// the Run shows its end, or after exitVisibleWait.
		wctx, cancel := context.WithTimeout(ctx, exitVisibleWait)
		_, _ = s.waitFor(wctx, c, conditionNextExit)
		cancel()
	case ctx.Err() == nil:
		s.log.Info("docker: attach ended early", "container", c.id[:12], "error", err)
	}
	return true
}

// exitVisibleWait bounds how long an attach stream whose task ended waits
// for the container's Run to show that end.
const exitVisibleWait = 10 * time.Second

// joinTask starts an attach session into the container's task, waiting
// while its Run is on its way to Running (the Runs in memory may lag).
func (s *Server) joinTask(ctx context.Context, c *ctr, stdin bool, size exec.TermSize, controlOnly bool) (exec.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, joinWait)
	defer cancel()
	for {
		ch := s.changes()
		cur, err := s.lookup(c.id)
		if err != nil {
			return nil, err
		}
		if cur.run == nil || cur.run.Status.Phase.Terminal() {
			return nil, errNotRunning(c)
		}
		x, uid, err := s.cfg.Backend.ExecRoute(cur.run.Namespace, cur.run.Name)
		if err == nil {
			var sess exec.Session
			sess, err = x.Start(ctx, exec.Request{RunUID: uid, Attach: true, Stdin: stdin, StdinOnce: c.meta.StdinOnce && !c.meta.Tty, TTY: c.meta.Tty, Size: size, ControlOnly: controlOnly})
			if err == nil {
				return sess, nil
			}
		}
		if !errors.Is(err, errdefs.ErrNotRunning) && !errors.Is(err, errdefs.ErrUnavailable) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("container %s: attach: %w (%w)", c.id[:12], ctx.Err(), err)
		case <-ch:
		case <-time.After(waitRecheck):
		}
	}
}

// joinWait bounds how long joining a task waits for it to start running
// where it runs (a Python task's dependencies are being installed).
const joinWait = 30 * time.Second

// containerResize sets the size of a running container's terminal: an
// attach session that starts with that size, and ends; without a TTY it
// does nothing, as Docker.
func (s *Server) containerResize(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	size, err := parseSize(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !c.running() {
		writeError(w, errNotRunning(c))
		return
	}
	if !c.meta.Tty || size.Width == 0 || size.Height == 0 {
		w.WriteHeader(http.StatusOK)
		return
	}
	sess, err := s.joinTask(r.Context(), c, false, size, true)
	if err != nil {
		writeError(w, err)
		return
	}
	_ = sess.Close()
	w.WriteHeader(http.StatusOK)
}
