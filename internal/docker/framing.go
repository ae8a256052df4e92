package docker

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/moby/moby/api/types"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Stream numbers of the multiplexed framing.
const (
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
)

// framed writes Docker's multiplexed stream framing, the one writer of it:
// each write is a frame of an 8-byte header — the stream, three zero bytes,
// the length as a big-endian uint32 — and at most bounds.ExecFrame bytes.
// The frames of stdout and stderr go in whole (mu).
type framed struct {
	w      io.Writer
	stream byte
	mu     *sync.Mutex
}

// newFramed returns the stdout and stderr writers of one framed stream.
func newFramed(w io.Writer) (stdout, stderr io.Writer) {
	mu := &sync.Mutex{}
	return &framed{w: w, stream: streamStdout, mu: mu}, &framed{w: w, stream: streamStderr, mu: mu}
}

func (f *framed) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), bounds.ExecFrame)]
		var hdr [8]byte
		hdr[0] = f.stream
		binary.BigEndian.PutUint32(hdr[4:], uint32(len(chunk)))
		bufs := net.Buffers{hdr[:], chunk}
		if _, err := bufs.WriteTo(f.w); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// streamType is the Content-Type of an attach, exec or logs stream.
func streamType(tty bool) string {
	if tty {
		return types.MediaTypeRawStream
	}
	return types.MediaTypeMultiplexedStream
}

// checkUpgrade refuses, before any hijack, a request that does not ask to
// upgrade the connection to a raw stream (Connection: Upgrade, Upgrade: tcp).
func checkUpgrade(r *http.Request) error {
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "tcp") {
		return errdefs.InvalidArgument("Upgrade", "this endpoint hijacks the connection: send 'Connection: Upgrade' and 'Upgrade: tcp'")
	}
	return nil
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// hijack answers 101 UPGRADED and takes the connection over. Every
// refusal must come before it.
func hijack(w http.ResponseWriter, tty bool) (net.Conn, *bufio.Reader, error) {
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, errors.Join(errdefs.ErrInternal, err)
	}
	_, err = rw.WriteString("HTTP/1.1 101 UPGRADED\r\nContent-Type: " + streamType(tty) + "\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
	if err == nil {
		err = rw.Flush()
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, rw.Reader, nil
}

func writeJSONLine(w io.Writer, v any) {
	_ = json.NewEncoder(w).Encode(v)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}
