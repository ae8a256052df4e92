package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/randid"
)

// Listener wraps the API's listener so that the answers net/http writes by
// itself, before any handler runs, to a request it cannot parse (a header
// holding a control character, a bad request line, headers over the
// limit) carry the JSON error body and an invocation ID like every other
// error of the API, instead of Go's plain text. Wrap it outside any TLS
// listener: it rewrites the plain bytes.
func Listener(l net.Listener) net.Listener { return &malformedListener{l} }

type malformedListener struct{ net.Listener }

func (l *malformedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &malformedConn{Conn: c}, nil
}

// malformedConn rewrites net/http's own error answers. Those are the only
// writes that start a response with the headers below in this order: a
// handler's response has a Date header and its header keys sorted.
type malformedConn struct{ net.Conn }

// goErrorHeaders ends the status line of net/http's own error answers.
const goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *malformedConn) Write(b []byte) (int, error) {
	if answer, ok := jsonAnswerFor(b); ok {
		if _, err := c.Conn.Write(answer); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// NetConn is the wrapped connection (a *tls.Conn when the wrapper sits
// above TLS), as tls.Conn.NetConn names its own.
func (c *malformedConn) NetConn() net.Conn { return c.Conn }

// CloseWrite lets net/http half-close the connection after its answer to
// a request with headers over the limit, as it does without the wrapper.
func (c *malformedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// jsonAnswerFor returns the JSON answer that replaces b when b is one of
// net/http's own error answers ("HTTP/1.1 400 Bad Request: invalid header
// value" + goErrorHeaders + body).
func jsonAnswerFor(b []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(b, []byte(proto)) || len(b) < len(proto)+3 {
		return nil, false
	}
	statusLine, body, ok := bytes.Cut(b, []byte(goErrorHeaders))
	if !ok {
		return nil, false
	}
	code, err := strconv.Atoi(string(statusLine[len(proto) : len(proto)+3]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	category := errdefs.FromHTTP(code, "")
	if category == nil {
		category = errdefs.ErrInvalidArgument // 431: headers over the limit
	}
	msg := string(body)
	if msg == strconv.Itoa(code)+" "+http.StatusText(code) {
		msg += ": the request line or a header is malformed (a control character in a header value?)"
	}
	invID := randid.New("inv_")
	jsonBody, _ := json.Marshal(errorBodyOf(errdefs.Errorf(category, "%s", msg), invID))
	jsonBody = append(jsonBody, '\n')
	var out bytes.Buffer
	fmt.Fprintf(&out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n%s: %s\r\nContent-Length: %d\r\n\r\n",
		code, http.StatusText(code), httpapi.HeaderInvocationID, invID, len(jsonBody))
	out.Write(jsonBody)
	return out.Bytes(), true
}
