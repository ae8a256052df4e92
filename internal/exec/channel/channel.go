// Package channel speaks Kubernetes' v5.channel.k8s.io exec protocol over a
// WebSocket (gorilla/websocket does the framing): every binary message is
// one channel byte and its payload — 0 stdin, 1 stdout, 2 stderr, 3 the
// final metav1.Status (a NonZeroExitCode cause carries the exit code), 4 a
// resize as {"Width","Height"}, 255 the close of a channel (the client's
// stdin). Serve runs a started exec.Session on the server side (the
// gateway); NewSession is the client side (the CLI), an exec.Session too, so
// that clients and kubectl-compatible tools speak the same protocol.
//
// Flow control is the connection's own: a message is read only once the
// previous stdin payload was taken by the command, and an output message is
// written only as fast as the peer reads, so a slow end holds back the
// other and nothing is buffered beyond one frame.
package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// Protocol is the one subprotocol spoken.
const Protocol = remotecommand.StreamProtocolV5Name

// Channels.
const (
	chStdin  = remotecommand.StreamStdIn
	chStdout = remotecommand.StreamStdOut
	chStderr = remotecommand.StreamStdErr
	chStatus = remotecommand.StreamErr
	chResize = remotecommand.StreamResize
	chClose  = remotecommand.StreamClose
)

// readLimit bounds one incoming message: a channel byte and a frame, or a
// control message.
const readLimit = 1 + max(bounds.ExecFrame, bounds.ExecControlFrame, 2*bounds.Message)

// closeGrace bounds how long a closing handshake waits for the peer.
const closeGrace = time.Second

// Counters, when set, count the payload bytes each way.
type Counters struct {
	In, Out func(n int)
}

// writer serialises the messages of one connection (gorilla allows one
// writer at a time).
type writer struct {
	mu   sync.Mutex
	conn *websocket.Conn
	out  func(int)
}

func (w *writer) write(ch byte, p []byte) error {
	return w.writePieces(ch, p)
}

// writePieces writes one message of the pieces' bytes on channel ch.
func (w *writer) writePieces(ch byte, pieces ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	mw, err := w.conn.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	if _, err := mw.Write([]byte{ch}); err != nil {
		return err
	}
	n := 0
	for _, p := range pieces {
		if _, err := mw.Write(p); err != nil {
			return err
		}
		n += len(p)
	}
	if err := mw.Close(); err != nil {
		return err
	}
	if w.out != nil && (ch == chStdout || ch == chStderr || ch == chStdin) {
		w.out(n)
	}
	return nil
}

// channelWriter writes to one channel in messages of at most
// bounds.ExecFrame.
type channelWriter struct {
	w  *writer
	ch byte
}

func (c channelWriter) Write(p []byte) (int, error) {
	return c.WriteBuffers([][]byte{p})
}

// WriteBuffers writes the pieces' bytes as messages of at most
// bounds.ExecFrame, pieces that fit sharing a message, so that a
// frame that arrived in pieces is one message.
func (c channelWriter) WriteBuffers(pieces [][]byte) (int, error) {
	n := 0
	var msg [][]byte
	size := 0
	flush := func() error {
		if size == 0 {
			return nil
		}
		if err := c.w.writePieces(c.ch, msg...); err != nil {
			return err
		}
		n += size
		msg, size = msg[:0], 0
		return nil
	}
	for _, p := range pieces {
		for len(p) > 0 {
			k := min(len(p), bounds.ExecFrame-size)
			msg = append(msg, p[:k])
			size += k
			p = p[k:]
			if size == bounds.ExecFrame {
				if err := flush(); err != nil {
					return n, err
				}
			}
		}
	}
	if err := flush(); err != nil {
		return n, err
	}
	return n, nil
}

// Serve runs sess over an upgraded connection until the command ends, then
// sends its status and closes the connection. Output goes to stdout and
// stderr only when wanted (it is drained either way). The client leaving
// ends the session. Serve returns the exit or why the session ended.
func Serve(ctx context.Context, conn *websocket.Conn, sess exec.Session, stdin, stdout, stderr bool, c Counters) (exec.Exit, error) {
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn.SetReadLimit(readLimit)
	w := &writer{conn: conn, out: c.Out}
	stdinR, stdinW := io.Pipe()
	defer stdinR.Close()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel() // the client is gone: so is the session
		// One buffer for the connection: a message is taken whole into it
		// and handed to the command in one write, so that the next hop
		// sends it as one frame and nothing is allocated per message.
		buf := make([]byte, bounds.ExecFrame)
		for {
			_, r, err := conn.NextReader()
			if err != nil {
				_ = stdinW.CloseWithError(err)
				return
			}
			var ch [1]byte
			if _, err := io.ReadFull(r, ch[:]); err != nil {
				continue // an empty message carries nothing
			}
			switch ch[0] {
			case chStdin:
				if !stdin {
					continue
				}
				// A synchronous pipe: the next message is read once the
				// command has taken this one.
				n, err := copyMessage(stdinW, r, buf)
				if c.In != nil {
					c.In(n)
				}
				if err != nil && !errors.Is(err, io.ErrClosedPipe) {
					return
				}
			case chResize:
				var size struct{ Width, Height uint16 }
				if json.NewDecoder(r).Decode(&size) == nil {
					_ = sess.Resize(exec.TermSize{Width: size.Width, Height: size.Height})
				}
			case chClose:
				var which [1]byte
				if _, err := io.ReadFull(r, which[:]); err == nil && which[0] == chStdin {
					_ = stdinW.Close()
				}
			}
		}
	}()
	streams := exec.Streams{Stdout: io.Discard, Stderr: io.Discard}
	if stdout {
		streams.Stdout = channelWriter{w, chStdout}
	}
	if stderr {
		streams.Stderr = channelWriter{w, chStderr}
	}
	if stdin {
		streams.Stdin = stdinR
	}
	exit, err := sess.Stream(ctx, streams)
	status := statusOf(exit, err)
	if b, merr := json.Marshal(status); merr == nil {
		_ = w.write(chStatus, b)
	}
	w.mu.Lock()
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeGrace))
	w.mu.Unlock()
	// Wait briefly for the client's close, so that it reads the status
	// before the connection goes.
	t := time.NewTimer(closeGrace)
	select {
	case <-readDone:
	case <-t.C:
	}
	t.Stop()
	return exit, err
}

// copyMessage copies the rest of a message from r to w in writes of a full
// buf each (the last one shorter), and returns how many bytes it wrote.
func copyMessage(w io.Writer, r io.Reader, buf []byte) (int, error) {
	total := 0
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += m
			if werr != nil {
				return total, werr
			}
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return total, nil
		case err != nil:
			return total, err
		}
	}
}

// statusOf is the status-channel message for how a session ended.
func statusOf(exit exec.Exit, err error) metav1.Status {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}}
	switch {
	case err != nil:
		st.Status = metav1.StatusFailure
		st.Code = int32(errdefs.HTTPStatus(err))
		st.Reason = metav1.StatusReason(errdefs.Code(err).String())
		st.Message = bounds.Truncate(err.Error(), bounds.Message)
	case exit.Code == 0:
		st.Status = metav1.StatusSuccess
	default:
		st.Status = metav1.StatusFailure
		st.Reason = remotecommand.NonZeroExitCodeReason
		st.Message = fmt.Sprintf("command terminated with non-zero exit code: exit status %d", exit.Code)
		st.Details = &metav1.StatusDetails{Causes: []metav1.StatusCause{
			{Type: remotecommand.ExitCodeCauseType, Message: strconv.Itoa(exit.Code)},
		}}
	}
	return st
}

// exitOf reads a status-channel message back.
func exitOf(b []byte) (exec.Exit, error) {
	var st metav1.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return exec.Exit{}, fmt.Errorf("exec: bad status message: %w", err)
	}
	switch {
	case st.Status == metav1.StatusSuccess:
		return exec.Exit{}, nil
	case st.Reason == remotecommand.NonZeroExitCodeReason && st.Details != nil:
		for _, c := range st.Details.Causes {
			if c.Type == remotecommand.ExitCodeCauseType {
				code, err := strconv.Atoi(c.Message)
				if err != nil {
					return exec.Exit{}, fmt.Errorf("exec: bad exit code %q", c.Message)
				}
				return exec.Exit{Code: code}, nil
			}
		}
	}
	category := errdefs.FromHTTP(int(st.Code), string(st.Reason))
	if category == nil {
		category = errdefs.ErrInternal
	}
	return exec.Exit{}, errdefs.Errorf(category, "%s", st.Message)
}

// NewSession is the client side of a connection that has been upgraded
// with Protocol, for a session started with req.
func NewSession(conn *websocket.Conn, req exec.Request) exec.Session {
	conn.SetReadLimit(readLimit)
	return &clientSession{conn: conn, req: req, w: &writer{conn: conn}}
}

type clientSession struct {
	conn      *websocket.Conn
	req       exec.Request
	w         *writer
	closeOnce sync.Once
}

func (s *clientSession) Stream(ctx context.Context, st exec.Streams) (exec.Exit, error) {
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	if st.Stdin != nil && s.req.Stdin {
		go s.copyStdin(st.Stdin)
	}
	buf := make([]byte, bounds.ExecFrame)
	for {
		_, r, err := s.conn.NextReader()
		if err != nil {
			if ctx.Err() != nil {
				return exec.Exit{}, fmt.Errorf("exec session: %w", ctx.Err())
			}
			return exec.Exit{}, errdefs.Errorf(errdefs.ErrUnavailable, "exec: the connection ended without a status: %v", err)
		}
		var ch [1]byte
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			continue
		}
		var dst io.Writer
		switch ch[0] {
		case chStdout:
			dst = st.Stdout
		case chStderr:
			dst = st.Stderr
			if dst == nil {
				dst = st.Stdout
			}
		case chStatus:
			b, err := io.ReadAll(io.LimitReader(r, readLimit))
			if err != nil {
				return exec.Exit{}, errdefs.Errorf(errdefs.ErrUnavailable, "exec: reading the status: %v", err)
			}
			return exitOf(b)
		default:
			continue
		}
		if _, err := io.CopyBuffer(onlyWriter{dst}, r, buf); err != nil {
			if ctx.Err() != nil {
				return exec.Exit{}, fmt.Errorf("exec session: %w", ctx.Err())
			}
			return exec.Exit{}, fmt.Errorf("exec: copying output: %w", err)
		}
	}
}

// onlyWriter hides a writer's ReadFrom, so that CopyBuffer uses its buffer.
type onlyWriter struct{ io.Writer }

func (s *clientSession) copyStdin(r io.Reader) {
	stdin := channelWriter{s.w, chStdin}
	buf := make([]byte, bounds.ExecFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := stdin.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				_ = s.w.write(chClose, []byte{chStdin})
			}
			return
		}
	}
}

// Pid is 0: the protocol does not carry the command's process ID.
func (s *clientSession) Pid() int { return 0 }

func (s *clientSession) Resize(size exec.TermSize) error {
	b, err := json.Marshal(struct{ Width, Height uint16 }{size.Width, size.Height})
	if err != nil {
		return err
	}
	return s.w.write(chResize, b)
}

// Signal is not part of the protocol: a client ends the session instead.
func (s *clientSession) Signal(syscall.Signal) error {
	return errdefs.Errorf(errdefs.ErrUnimplemented, "exec: %s has no signal channel; close the session instead", Protocol)
}

func (s *clientSession) Close() error {
	s.closeOnce.Do(func() {
		// Close may race a write; WriteControl is safe beside it.
		_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeGrace))
		_ = s.conn.Close()
	})
	return nil
}
