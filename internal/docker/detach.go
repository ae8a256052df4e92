package docker

import (
	"errors"
	"io"
	"sync"

	"github.com/moby/term"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// defaultDetachKeys are Docker's: ctrl-p, ctrl-q.
var defaultDetachKeys = []byte{16, 17}

// parseDetachKeys reads Docker's detach key spec (`detachKeys` of attach,
// `DetachKeys` of exec create): comma-separated `ctrl-<c>` names or
// single characters, parsed by moby's own term.ToBytes; empty is the
// default. A bad spec is InvalidArgument, before any hijack.
func parseDetachKeys(spec string) ([]byte, error) {
	if spec == "" {
		return defaultDetachKeys, nil
	}
	keys, err := term.ToBytes(spec)
	if err != nil {
		return nil, errdefs.InvalidArgument("detachKeys", "Invalid detach keys (%s) provided: %v", bounds.Truncate(spec, bounds.Quoted), err)
	}
	return keys, nil
}

// errDetached is what a detaching stdin reports once the client detached:
// not io.EOF, so that the process's stdin is left open (an attach later
// goes on typing into it).
var errDetached = errors.New("the client detached")

// detachingStdin is a hijacked connection's stdin as Docker reads it when
// it does not close the process's stdin at EOF (a TTY, or no StdinOnce):
// with keys (a TTY), the detach sequence ends the session there and is not
// passed on (moby's escape proxy: a partial match followed by other bytes
// passes the held bytes through); and EOF (the client closed its side or
// went away) ends it too. Either way detach is called once and the reader
// reports errDetached; the process goes on running.
type detachingStdin struct {
	r      io.Reader
	once   sync.Once
	detach func()
}

func newDetachingStdin(r io.Reader, keys []byte, detach func()) *detachingStdin {
	if len(keys) > 0 {
		r = term.NewEscapeProxy(r, keys)
	}
	return &detachingStdin{r: r, detach: detach}
}

func (d *detachingStdin) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil {
		d.once.Do(d.detach)
		err = errDetached
	}
	return n, err
}

// detachableWriter writes to w until the client detached or a write to it
// failed (the client went away); from then on it discards, so that the
// process goes on running with no one reading.
type detachableWriter struct {
	mu   sync.Mutex
	w    io.Writer
	gone bool
}

func (d *detachableWriter) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.gone {
		if _, err := d.w.Write(p); err != nil {
			d.gone = true
		}
	}
	return len(p), nil
}

// detach discards from now on; the caller first closes the connection,
// which ends a write blocked on it.
func (d *detachableWriter) detach() {
	d.mu.Lock()
	d.gone = true
	d.mu.Unlock()
}
