package bash

import (
	"bytes"
	"strconv"
	"strings"

	"stoke.dev/stoke/internal/bounds"
)

// maxTrailer bounds the trailer "\x1e<nonce> done N PID STATUS\n" after
// the marker.
const maxTrailer = 80

// output collects one request's FIFO: the function's stdout and, after
// it, the trailer the child writes once the function has returned. It
// keeps at most bounds.InvokeBody bytes of output (and the trailer) and
// drops the rest, so that the writer never blocks.
type output struct {
	marker []byte // the trailer's start
	seq    uint64
	keep   int // the output may take the whole bound and the trailer follow it
	buf    []byte
	// next is where the search for the trailer resumes; discard is where
	// reads go once buf is full.
	next    int
	discard []byte

	out     []byte // the output, once the trailer or end-of-file was read
	trailer bool   // the trailer was read
	pid, rc int    // from the trailer: the child and the function's status
}

func newOutput(marker []byte, seq uint64) *output {
	return &output{marker: marker, seq: seq, keep: bounds.InvokeBody + len(marker) + maxTrailer,
		buf: make([]byte, 0, 512)}
}

// space is where the next read goes.
func (r *output) space() []byte {
	if r.over() {
		if r.discard == nil {
			r.discard = make([]byte, 64<<10)
		}
		return r.discard
	}
	if len(r.buf) == cap(r.buf) {
		r.buf = append(r.buf, 0)[:len(r.buf)]
	}
	return r.buf[len(r.buf):min(cap(r.buf), r.keep+1)]
}

func (r *output) took(n int) {
	if n > 0 && !r.over() {
		r.buf = r.buf[:len(r.buf)+n]
	}
}

// over reports that the output is known to pass the bound.
func (r *output) over() bool { return len(r.buf) > r.keep }

// findTrailer looks for a complete trailer line in what was read since the
// last call. Output after it (a background job's) is dropped.
func (r *output) findTrailer() bool {
	for {
		i := bytes.Index(r.buf[r.next:], r.marker)
		if i < 0 {
			// The marker may be cut by the end of this read.
			r.next = max(r.next, len(r.buf)-len(r.marker)+1)
			return false
		}
		i += r.next
		line := r.buf[i+len(r.marker):]
		end := bytes.IndexByte(line, '\n')
		if end < 0 {
			r.next = i // the line is not complete yet
			return false
		}
		f := strings.Fields(string(line[:end]))
		if len(f) != 4 || f[0] != "done" || f[1] != strconv.FormatUint(r.seq, 10) {
			// Not this request's trailer: only a handler that knows the
			// nonce can write that, so it is output.
			r.next = i + 1
			continue
		}
		r.pid, _ = strconv.Atoi(f[2])
		r.rc, _ = strconv.Atoi(f[3])
		r.out, r.trailer = r.buf[:i], true
		return true
	}
}
