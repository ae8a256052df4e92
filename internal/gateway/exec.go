package gateway

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/channel"
)

// ExecRouter finds where an exec session into a Run starts: the executor
// of the pod the Run is assigned to (runtimed's hop) and the Run's UID. Its
// errors are NotFound (no such Run), NotRunning (not a running task or a
// Ready function) and Unavailable (its pod is gone).
type ExecRouter interface {
	ExecRoute(namespace, name string) (exec.Executor, string, error)
}

// execPath is the exec endpoint, a GET upgraded to a WebSocket.
const execPath = "GET /v1/namespaces/{ns}/runs/{name}/exec"

// exec starts an exec session and, once it runs, upgrades the connection
// to a WebSocket speaking channel.Protocol. Every refusal before the
// upgrade is the JSON error body; after it, the status channel says how
// the session ended.
func (g *Gateway) exec(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("ns"), r.PathValue("name")
	log := g.log.With("run", ns+"/"+name)
	refuse := func(err error) {
		status := errdefs.HTTPStatus(err)
		g.cfg.Metrics.observeExecStart(status)
		log.Info("exec refused", "status", status, "error", err)
		writeError(w, err, "")
	}
	req, out, errOut, err := execRequest(r)
	if err != nil {
		refuse(err)
		return
	}
	if err := checkOrigin(r); err != nil {
		refuse(err)
		return
	}
	if !websocket.IsWebSocketUpgrade(r) {
		refuse(errdefs.InvalidArgument("Upgrade", "an exec is a WebSocket: upgrade the connection with the %s subprotocol", channel.Protocol))
		return
	}
	if !slices.Contains(websocket.Subprotocols(r), channel.Protocol) {
		refuse(errdefs.InvalidArgument("Sec-WebSocket-Protocol", "must offer %s", channel.Protocol))
		return
	}
	x, uid, err := g.cfg.Exec.ExecRoute(ns, name)
	if err != nil {
		refuse(err)
		return
	}
	req.RunUID = uid
	log = log.With("run_uid", uid)
	start := time.Now()
	sess, err := x.Start(r.Context(), req)
	if err != nil {
		refuse(err)
		return
	}
	defer sess.Close()
	up := websocket.Upgrader{
		Subprotocols:    []string{channel.Protocol},
		ReadBufferSize:  bounds.ExecFrame + 1,
		WriteBufferSize: bounds.ExecFrame + 1,
		// Checked above, with a JSON answer.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		// The upgrader has answered; the session goes with Close.
		g.cfg.Metrics.observeExecStart(http.StatusBadRequest)
		log.Info("exec upgrade failed", "error", err)
		return
	}
	g.cfg.Metrics.observeExecStart(http.StatusSwitchingProtocols)
	done := g.cfg.Metrics.execOpened()
	defer done()
	what := "attach"
	if !req.Attach {
		what = req.Command[0]
	}
	log.Info("exec started", "command", what, "tty", req.TTY, "setup", time.Since(start))
	exit, err := channel.Serve(r.Context(), conn, sess, req.Stdin, out, errOut, g.cfg.Metrics.execCounters())
	log.Info("exec ended", "exit_code", exit.Code, "error", err, "duration", time.Since(start))
}

// execRequest reads Kubernetes' exec query: command (repeated), stdin,
// stdout, stderr, tty; container is taken and ignored. Stoke's own
// attach=true joins the task's own process instead of running a command
// (`stoke run -i/-t`; the task must have been started with stdin or a
// terminal), with stdinOnce=true its stdin's EOF closing the task's, and
// without stdout and stderr taking no output (stdin, resize, signals).
func execRequest(r *http.Request) (req exec.Request, stdout, stderr bool, err error) {
	q, err := queryOf(r, execParams)
	if err != nil {
		return req, false, false, err
	}
	var flags [6]bool
	for i, name := range []string{"stdin", "stdout", "stderr", "tty", "attach", "stdinOnce"} {
		if flags[i], err = boolParam(q, name); err != nil {
			return req, false, false, err
		}
	}
	req.Stdin, stdout, stderr, req.TTY, req.Attach, req.StdinOnce = flags[0], flags[1], flags[2], flags[3], flags[4], flags[5]
	req.Command = q["command"]
	switch {
	case req.Attach && len(req.Command) > 0:
		return req, false, false, errdefs.InvalidArgument("command", "must be absent with attach=true: an attach joins the task's own process")
	case req.StdinOnce && !req.Attach:
		return req, false, false, errdefs.InvalidArgument("stdinOnce", "applies to attach=true only")
	case !req.Attach && (len(req.Command) == 0 || req.Command[0] == ""):
		return req, false, false, errdefs.InvalidArgument("command", "must not be empty: give it once per argument (command=ls&command=-l)")
	}
	req.ControlOnly = req.Attach && !stdout && !stderr
	switch {
	case !req.Stdin && !stdout && !stderr:
		return req, false, false, errdefs.InvalidArgument("stdin", "at least one of stdin, stdout and stderr must be true")
	case req.TTY && stderr:
		return req, false, false, errdefs.InvalidArgument("stderr", "must be false with tty: a terminal has one output")
	}
	return req, stdout, stderr, nil
}

// checkOrigin refuses a browser's cross-site upgrade (cross-site WebSocket
// hijacking): an Origin header, when present, must name this host.
func checkOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || !strings.EqualFold(u.Host, r.Host) {
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "exec: cross-origin upgrade from %q refused", origin)
	}
	return nil
}
