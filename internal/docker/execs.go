package docker

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// execRec is one `docker exec`: created, running or ended.
type execRec struct {
	id, container string
	req           container.ExecCreateRequest
	// detachKeys end a TTY session's stream, the command going on
	// (DetachKeys, or Docker's ctrl-p,ctrl-q).
	detachKeys []byte

	mu      sync.Mutex
	started bool
	running bool
	exit    *int
	// pid is the command's process ID where it runs, from its start on.
	pid  int
	sess exec.Session
	// size is the terminal's size; a resize that comes while the session
	// starts (the CLI sends it as it starts the exec) is applied once it
	// has started.
	size exec.TermSize
}

// execTable holds the execs, at most bounds.DockerExecs; the oldest ended
// (or never started) ones make room for new ones.
type execTable struct {
	mu    sync.Mutex
	m     map[string]*execRec
	order []string
}

func newExecTable() *execTable { return &execTable{m: map[string]*execRec{}} }

func (t *execTable) add(e *execRec) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= bounds.DockerExecs {
		for i, id := range t.order {
			old := t.m[id]
			old.mu.Lock()
			idle := !old.running
			old.mu.Unlock()
			if idle {
				delete(t.m, id)
				t.order = append(t.order[:i:i], t.order[i+1:]...)
				break
			}
		}
	}
	if len(t.m) >= bounds.DockerExecs {
		return errdefs.Errorf(errdefs.ErrResourceExhausted, "%d exec sessions are running, the most this server keeps; wait for one to end", bounds.DockerExecs)
	}
	t.m[e.id] = e
	t.order = append(t.order, e.id)
	return nil
}

func (t *execTable) get(id string) (*execRec, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[id]; ok {
		return e, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "No such exec instance: %s", bounds.Truncate(id, bounds.Quoted))
}

// dropContainer forgets the execs of a removed container.
func (t *execTable) dropContainer(cid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	kept := t.order[:0]
	for _, id := range t.order {
		if t.m[id].container == cid {
			delete(t.m, id)
			continue
		}
		kept = append(kept, id)
	}
	t.order = kept
}

func (s *Server) execCreate(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req container.ExecCreateRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case !c.running():
		writeError(w, errdefs.Errorf(errdefs.ErrNotRunning, "container %s is not running", c.id))
		return
	case len(req.Cmd) == 0:
		writeError(w, errdefs.InvalidArgument("Cmd", "No exec command specified"))
		return
	case req.User != "" || req.Privileged:
		writeError(w, errdefs.InvalidArgument("User", "an exec runs as its Run's user on Stoke; --user and --privileged are not supported"))
		return
	case req.WorkingDir != "":
		writeError(w, errdefs.InvalidArgument("WorkingDir", "an exec runs in its Run's working directory on Stoke; -w is not supported"))
		return
	case req.Tty && req.AttachStderr && !req.AttachStdout:
		req.AttachStdout = true
	}
	if _, err := toExecRequest(&req, ""); err != nil {
		writeError(w, err)
		return
	}
	keys, err := parseDetachKeys(req.DetachKeys)
	if err != nil {
		writeError(w, err)
		return
	}
	e := &execRec{id: newID(), container: c.id, req: req, detachKeys: keys}
	if req.ConsoleSize != nil {
		e.size = exec.TermSize{Height: uint16(min(req.ConsoleSize[0], 65535)), Width: uint16(min(req.ConsoleSize[1], 65535))}
	}
	if err := s.execs.add(e); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, container.ExecCreateResponse{ID: e.id})
}

// toExecRequest is the Exec service's request of a Docker exec, checked.
func toExecRequest(req *container.ExecCreateRequest, uid string) (exec.Request, error) {
	x := exec.Request{RunUID: uid, Command: req.Cmd, TTY: req.Tty, Stdin: req.AttachStdin}
	if x.RunUID == "" {
		x.RunUID = "check"
	}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if x.Env == nil {
			x.Env = map[string]string{}
		}
		x.Env[k] = v
	}
	return x, x.Validate()
}

func (s *Server) execStart(w http.ResponseWriter, r *http.Request) {
	e, err := s.execs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var start container.ExecStartRequest
	if err := readJSON(r, &start); err != nil {
		writeError(w, err)
		return
	}
	if !start.Detach {
		if err := checkUpgrade(r); err != nil {
			writeError(w, err)
			return
		}
	}
	c, err := s.lookup(e.container)
	if err != nil {
		writeError(w, err)
		return
	}
	if !c.running() {
		writeError(w, errdefs.Errorf(errdefs.ErrNotRunning, "container %s is not running", c.id))
		return
	}
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		writeError(w, errdefs.Errorf(errdefs.ErrAlreadyExists, "exec %s has already been started", e.id[:12]))
		return
	}
	e.started = true
	size := e.size
	e.mu.Unlock()
	if start.ConsoleSize != nil {
		size = exec.TermSize{Height: uint16(min(start.ConsoleSize[0], 65535)), Width: uint16(min(start.ConsoleSize[1], 65535))}
	}
	sess, err := s.startExec(r.Context(), c, e, size)
	if err != nil {
		e.mu.Lock()
		e.started = false
		e.mu.Unlock()
		writeError(w, err)
		return
	}
	if start.Detach {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.streamExec(s.serverCtx(), e, sess, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
		}()
		w.WriteHeader(http.StatusOK)
		return
	}
	conn, in, err := hijack(w, e.req.Tty)
	if err != nil {
		s.log.Info("docker: exec hijack failed", "exec", e.id[:12], "error", err)
		sess.Close()
		e.ended(126)
		return
	}
	defer conn.Close()
	streams := exec.Streams{Stdout: io.Discard, Stderr: io.Discard}
	if e.req.Tty {
		// As Docker: with a TTY the detach keys, stdin's EOF or a
		// client gone end the stream, not the command, which runs on
		// with its output discarded (`docker exec -it`, Ctrl-P Ctrl-Q).
		out := &detachableWriter{w: io.Discard}
		if e.req.AttachStdout {
			out.w = conn
		}
		streams.Stdout = out
		if e.req.AttachStdin {
			streams.Stdin = newDetachingStdin(in, e.detachKeys, func() {
				_ = conn.Close()
				out.detach()
			})
		}
		s.streamExec(s.serverCtx(), e, sess, streams)
		return
	}
	stdout, stderr := newFramed(conn)
	if e.req.AttachStdout {
		streams.Stdout = stdout
	}
	if e.req.AttachStderr {
		streams.Stderr = stderr
	}
	if e.req.AttachStdin {
		streams.Stdin = in
	}
	s.streamExec(s.serverCtx(), e, sess, streams)
}

// startExec starts the session through the Exec service: every error is
// the client's before the hijack.
func (s *Server) startExec(ctx context.Context, c *ctr, e *execRec, size exec.TermSize) (exec.Session, error) {
	x, uid, err := s.cfg.Backend.ExecRoute(c.run.Namespace, c.run.Name)
	if err != nil {
		return nil, err
	}
	req, err := toExecRequest(&e.req, uid)
	if err != nil {
		return nil, err
	}
	req.Size = size
	e.mu.Lock()
	e.size = size
	e.mu.Unlock()
	sess, err := x.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.sess, e.running, e.pid = sess, true, sess.Pid()
	resized := e.size
	e.mu.Unlock()
	if resized != size {
		_ = sess.Resize(resized)
	}
	return sess, nil
}

// ended records the exec's end with its exit status.
func (e *execRec) ended(code int) {
	e.mu.Lock()
	e.running, e.exit, e.sess = false, &code, nil
	e.mu.Unlock()
}

// streamExec copies the session to the end and records its exit.
func (s *Server) streamExec(ctx context.Context, e *execRec, sess exec.Session, streams exec.Streams) {
	defer sess.Close()
	start := time.Now()
	exit, err := sess.Stream(ctx, streams)
	code := exit.Code
	if err != nil {
		code = 126
		if errors.Is(err, context.Canceled) {
			code = 130
		}
	}
	e.ended(code)
	s.log.Info("docker: exec ended", "exec", e.id[:12], "container", e.container[:12], "exit_code", code, "error", err, "duration", time.Since(start))
}

func (s *Server) execResize(w http.ResponseWriter, r *http.Request) {
	e, err := s.execs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	size, err := parseSize(r)
	if err != nil {
		writeError(w, err)
		return
	}
	e.mu.Lock()
	sess := e.sess
	e.size = size
	e.mu.Unlock()
	if sess != nil {
		if err := sess.Resize(size); err != nil {
			writeError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func parseSize(r *http.Request) (exec.TermSize, error) {
	q := r.URL.Query()
	h, err1 := strconv.ParseUint(q.Get("h"), 10, 16)
	wd, err2 := strconv.ParseUint(q.Get("w"), 10, 16)
	if err1 != nil || err2 != nil {
		return exec.TermSize{}, errdefs.InvalidArgument("h", "h and w must be numbers of rows and columns")
	}
	return exec.TermSize{Height: uint16(h), Width: uint16(wd)}, nil
}

func (s *Server) execInspect(w http.ResponseWriter, r *http.Request) {
	e, err := s.execs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := container.ExecInspectResponse{ID: e.id, Running: e.running, ExitCode: e.exit, Pid: e.pid, ContainerID: e.container,
		OpenStdin: e.req.AttachStdin, OpenStdout: e.req.AttachStdout, OpenStderr: e.req.AttachStderr, CanRemove: !e.running && e.started,
		ProcessConfig: &container.ExecProcessConfig{Tty: e.req.Tty, Entrypoint: e.req.Cmd[0], Arguments: e.req.Cmd[1:]}}
	writeJSON(w, http.StatusOK, out)
}
