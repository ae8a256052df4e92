// Package loglines turns a child's raw output stream into bounded log lines,
// so that a program writing megabytes without a newline can neither block its
// pipe nor produce an unbounded log record.
package loglines

import (
	"bytes"
	"io"

	"stoke.dev/stoke/internal/bounds"
)

// Pump reads r until EOF or error and calls emit for each line, without its
// newline. A line longer than bounds.LogLine is emitted in pieces of that
// size. emit must not keep the slice.
func Pump(r io.Reader, emit func(line []byte)) {
	PumpSize(r, bounds.LogLine, emit)
}

// PumpFlush is Pump that calls flush before every read: the lines emitted
// until then are all the output that has arrived, so a consumer that
// buffers them writes them out before the pump waits for more.
func PumpFlush(r io.Reader, emit func(line []byte), flush func()) {
	Pump(flushReader{r: r, flush: flush}, emit)
}

type flushReader struct {
	r     io.Reader
	flush func()
}

func (f flushReader) Read(p []byte) (int, error) {
	f.flush()
	return f.r.Read(p)
}

// PumpSize is Pump with an explicit maximum line length.
func PumpSize(r io.Reader, max int, emit func(line []byte)) {
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		data := chunk[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				// A full buffer is emitted only when more data follows, so a
				// line of exactly max bytes is one line whatever the read size.
				room := max - len(buf)
				if len(data) <= room {
					buf = append(buf, data...)
					break
				}
				buf = append(buf, data[:room]...)
				emit(buf)
				buf = buf[:0]
				data = data[room:]
				continue
			}
			line := data[:i]
			data = data[i+1:]
			for len(buf)+len(line) > max {
				room := max - len(buf)
				buf = append(buf, line[:room]...)
				emit(buf)
				buf = buf[:0]
				line = line[room:]
			}
			buf = append(buf, line...)
			emit(buf)
			buf = buf[:0]
		}
		if err != nil {
			if len(buf) > 0 {
				emit(buf)
			}
			return
		}
	}
}
