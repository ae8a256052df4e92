package bash

import (
	"bytes"
	"strconv"
	"strings"
	"sync"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/loglines"
)

// tailMax bounds the stderr kept per invocation (and while loading) for
// error messages; all of it goes to the Run's output regardless.
const tailMax = 2 << 10

// pumpStderr files stderr in the Run's output line by line, with the
// invocation it belongs to, and acts on the sync markers.
func (in *instance) pumpStderr() {
	defer close(in.pumpDone)
	loglines.PumpFlush(in.stderr, func(line []byte) {
		if len(line) == 0 {
			// Each sync marker starts with a newline to end a partial
			// line, which leaves blank lines that carry nothing.
			return
		}
		// A marker starts with a newline of its own, but a background job
		// writing at the same moment can still precede it on its line.
		if i := bytes.Index(line, in.marker); i >= 0 {
			rest := string(line[i+len(in.marker):])
			if k, ok := strings.CutPrefix(rest, "sync "); ok {
				n, _ := strconv.ParseUint(k, 10, 64)
				in.mu.Lock()
				in.syncedLocked(n)
				in.mu.Unlock()
			}
			if line = line[:i]; len(line) == 0 {
				return
			}
		}
		in.mu.Lock()
		var c *call
		if len(in.logging) > 0 {
			c = in.logging[0]
		}
		in.mu.Unlock()
		id := ""
		if c != nil {
			id = c.id
			c.stderr.add(line)
		} else {
			in.initTail.add(line)
		}
		in.out.Line("stderr", id, line)
	}, in.out.Flush)
}

// tail keeps the last tailMax bytes of the lines added to it.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) add(line []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(append(t.b, line...), '\n')
	if len(t.b) > 2*tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Stderr is any bytes; the text goes into protobuf strings.
	s := strings.ToValidUTF8(string(bytes.TrimRight(t.b, "\n")), "\uFFFD")
	return bounds.TruncateHead(s, tailMax)
}
