package agent

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// maxMessage bounds one WebSocket message of the agent connection in both
// directions. gRPC's HTTP/2 frames ride in them, each Write of its
// transport (at most its write buffer, connBuffer) one message.
const maxMessage = 4 * connBuffer

// wsConn is a WebSocket as the byte stream gRPC needs: each Write is one
// binary message, Read runs across message boundaries. Both ends bound a
// message (maxMessage); a bigger one fails the connection, it is never
// cut. Reads and writes may run at once, as net.Conn allows; gorilla's
// control frames (close, ping) are answered by its read loop.
type wsConn struct {
	ws *websocket.Conn
	// counted, when set, is told the bytes of every message each way.
	counted func(in, out int)

	rmu sync.Mutex
	r   io.Reader // the message being read, or nil

	wmu sync.Mutex
}

func newWSConn(ws *websocket.Conn, counted func(in, out int)) *wsConn {
	ws.SetReadLimit(maxMessage)
	return &wsConn{ws: ws, counted: counted}
}

func (c *wsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.r == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				var ce *websocket.CloseError
				if errors.As(err, &ce) && ce.Code == websocket.CloseNormalClosure {
					return 0, io.EOF
				}
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				return 0, errors.New("agent connection: a text message")
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if errors.Is(err, io.EOF) {
			c.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		if n > 0 && c.counted != nil {
			c.counted(n, 0)
		}
		return n, err
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		k := min(len(p), maxMessage)
		if err := c.ws.WriteMessage(websocket.BinaryMessage, p[:k]); err != nil {
			return n, err
		}
		if c.counted != nil {
			c.counted(0, k)
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Close sends a close frame (gorilla lets WriteControl run beside a
// write) and closes the connection, which ends a write blocked on it.
func (c *wsConn) Close() error {
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	return c.ws.Close()
}

func (c *wsConn) LocalAddr() net.Addr  { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr { return c.ws.RemoteAddr() }
func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.ws.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}
func (c *wsConn) SetReadDeadline(t time.Time) error { return c.ws.SetReadDeadline(t) }

// SetWriteDeadline takes the write lock: gorilla keeps the deadline in a
// field its writes read (gRPC sets it once, around its handshake).
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.ws.SetWriteDeadline(t)
}
