package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/channel"
)

// handshakeTimeout bounds an exec's WebSocket handshake.
const handshakeTimeout = 30 * time.Second

// Exec returns an exec.Executor through the server's exec endpoint
// (docs/http-api.md, "Exec"): at this hop a Request's RunUID names the Run
// as "namespace/name", and its RegistrationID and Env must be empty (the
// endpoint takes neither). Errors before the session starts are
// *APIError; a session's own end comes from its status channel.
func (c *Client) Exec() exec.Executor { return &wsExecutor{c: c} }

type wsExecutor struct{ c *Client }

func (e *wsExecutor) Start(ctx context.Context, req exec.Request) (exec.Session, error) {
	ns, name, ok := strings.Cut(req.RunUID, "/")
	if !ok || ns == "" || name == "" {
		return nil, errdefs.InvalidArgument("run", "%q: want namespace/name", req.RunUID)
	}
	if req.RegistrationID != "" || len(req.Env) > 0 {
		return nil, errdefs.InvalidArgument("request", "the exec endpoint takes no registration ID or env")
	}
	q := url.Values{"command": req.Command}
	q.Set("stdout", strconv.FormatBool(!req.ControlOnly))
	q.Set("stderr", strconv.FormatBool(!req.TTY && !req.ControlOnly))
	q.Set("stdin", strconv.FormatBool(req.Stdin))
	q.Set("tty", strconv.FormatBool(req.TTY))
	if req.Attach {
		// Stoke's own: the task's own process (`stoke run -i/-t`).
		q.Set("attach", "true")
		q.Set("stdinOnce", strconv.FormatBool(req.StdinOnce))
	}
	u := e.c.url(q, e.c.dataplanePath(ns, name, "exec", "")...)
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	h := http.Header{}
	if e.c.token != "" {
		h.Set("Authorization", "Bearer "+e.c.token)
	}
	upgrade := e.c.upgrade
	if upgrade == nil {
		upgrade = e.c.dialWebSocket
	}
	conn, resp, err := upgrade(ctx, u.String(), h, []string{channel.Protocol})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return nil, readError(resp)
		}
		return nil, &UnreachableError{Server: e.c.base.String(), Err: err}
	}
	if conn.Subprotocol() != channel.Protocol {
		_ = conn.Close()
		return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "exec: the server did not agree to %s", channel.Protocol)
	}
	if req.TTY && req.Size != (exec.TermSize{}) {
		s := channel.NewSession(conn, req)
		if err := s.Resize(req.Size); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("exec: initial size: %w", err)
		}
		return s, nil
	}
	return channel.NewSession(conn, req), nil
}

// dialWebSocket opens a WebSocket with the HTTP client's TLS settings.
func (c *Client) dialWebSocket(ctx context.Context, u string, h http.Header, subprotocols []string) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{
		Subprotocols:     subprotocols,
		HandshakeTimeout: handshakeTimeout,
		Proxy:            http.ProxyFromEnvironment,
		ReadBufferSize:   bounds.ExecFrame + 1,
		WriteBufferSize:  bounds.ExecFrame + 1,
	}
	if tr, ok := c.hc.Transport.(*http.Transport); ok && tr != nil {
		d.TLSClientConfig = tr.TLSClientConfig
		if tr.DialContext != nil {
			d.NetDialContext = tr.DialContext
		}
	}
	return d.DialContext(ctx, u, h)
}
