package runlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"stoke.dev/stoke/internal/logging"
)

// flushAt is how much a Sink buffers before it writes without being asked.
const flushAt = 64 << 10

// maxRecord is about the longest record of a line of bounds.LogLine bytes
// (every byte escaped): a log opened with less room than this before
// MaxBytes is taken as full.
const maxRecord = 6*(16<<10) + 1<<10

// markerBytes appears in a log only in a truncation record: inside a line
// its quotes would be escaped.
var markerBytes = []byte(`"stream":"` + StreamTruncated + `"`)

// Files is the writing side of the Run logs, in the Runtime Server: it
// hands out a Sink per execution or registration, and the Sinks of one
// Run share its file and its bound.
type Files struct {
	dir string
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	open map[string]*file // by log name, while a Sink uses it
}

// NewFiles returns the writer of the logs under dir, creating it (mode
// 0700). now defaults to time.Now; log is for write failures (one line per
// file at most).
func NewFiles(dir string, log *slog.Logger, now func() time.Time) (*Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run logs: %w", err)
	}
	log = logging.OrDiscard(log)
	if now == nil {
		now = time.Now
	}
	return &Files{dir: dir, log: log, now: now, open: map[string]*file{}}, nil
}

// OpenRun returns the Sink of a function Run's registration: its records
// carry no attempt.
func (fs *Files) OpenRun(uid string) (*Sink, error) {
	return fs.openSink(uid, 0)
}

// OpenExecution returns the Sink of a task execution. Runtimed's ids
// (ExecutionID) file the output in the Run's log under the attempt; any
// other id names a log of its own.
func (fs *Files) OpenExecution(id string) (*Sink, error) {
	if uid, attempt, ok := parseExecutionID(id); ok {
		return fs.openSink(uid, attempt)
	}
	return fs.openSink(id, 0)
}

func (fs *Files) openSink(name string, attempt int32) (*Sink, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.open[name]
	if f == nil {
		f = &file{fs: fs, name: name}
		fs.open[name] = f
	}
	f.refs++
	return &Sink{f: f, attempt: attempt}, nil
}

// file is one log file shared by the Sinks of its Run. Its descriptor is
// opened at the first write, so a Run that prints nothing has no file.
type file struct {
	fs   *Files
	name string
	refs int // Sinks not closed; under fs.mu

	// dropping is set once the output reached the bound and the
	// truncation record is written; read without mu so that dropped
	// output costs no lock.
	dropping atomic.Bool

	mu     sync.Mutex
	fd     *os.File
	path   string
	size   int64 // in the file or buffered
	full   bool  // no more output fits
	marked bool  // the log has its truncation record
	buf    []byte
	failed bool // a write failed: logged once, later output dropped
}

// Sink appends one execution's or registration's output to its Run's log,
// buffered: whoever feeds it calls Flush before waiting for more output,
// so that nothing waits in the buffer while the program is quiet. A nil
// *Sink discards everything. Its methods are safe for concurrent use.
type Sink struct {
	f       *file
	attempt int32
	closed  atomic.Bool
}

// Line files one line of output (without its newline) of stream, in the
// invocation invocationID ("" outside invocations). Past the log's bound
// it writes the truncation record once and drops the rest.
func (s *Sink) Line(stream, invocationID string, line []byte) {
	if s == nil || s.f.dropping.Load() || s.closed.Load() {
		return
	}
	f := s.f
	b := f.encode(Record{Time: f.fs.now(), Attempt: s.attempt, Stream: stream, Line: string(line), InvocationID: invocationID})
	f.mu.Lock()
	defer f.mu.Unlock()
	if b == nil || !f.openLocked() {
		return
	}
	if !f.full && f.size+int64(len(b)) <= MaxBytes {
		f.appendLocked(b)
		if len(f.buf) >= flushAt {
			f.flushLocked()
		}
		return
	}
	f.full = true
	if !f.marked {
		f.marked = true
		if m := f.encode(Record{Time: f.fs.now(), Attempt: s.attempt, Stream: StreamTruncated,
			Line: fmt.Sprintf("the log reached its bound of %d bytes; later output was dropped", MaxBytes)}); m != nil {
			f.appendLocked(m)
		}
		f.flushLocked()
	}
	f.dropping.Store(true)
}

// Dropping reports whether Line drops everything from now on (the log
// reached its bound, or there is no log): a pump may then stop splitting
// lines.
func (s *Sink) Dropping() bool {
	return s == nil || s.closed.Load() || s.f.dropping.Load()
}

// Exit files the exit record that ends a task attempt, past the bound too
// (within a reserve), and writes the buffer.
func (s *Sink) Exit(code int32) {
	if s == nil || s.closed.Load() {
		return
	}
	f := s.f
	b := f.encode(Record{Time: f.fs.now(), Attempt: s.attempt, Stream: StreamExit, ExitCode: &code})
	f.mu.Lock()
	defer f.mu.Unlock()
	if b == nil || !f.openLocked() {
		return
	}
	if f.size+int64(len(b)) <= MaxBytes+exitReserve {
		f.appendLocked(b)
	}
	f.flushLocked()
}

// Flush writes what is buffered.
func (s *Sink) Flush() {
	if s == nil {
		return
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.flushLocked()
}

// Close writes what is buffered and releases the file once no Sink of its
// Run is left. It may be called more than once.
func (s *Sink) Close() {
	if s == nil || s.closed.Swap(true) {
		return
	}
	s.Flush()
	f := s.f
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.refs--; f.refs > 0 {
		return
	}
	delete(f.fs.open, f.name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd != nil {
		_ = f.fd.Close()
		f.fd = nil
	}
}

// encode returns rec as a line of the file, or nil if it does not encode
// (a clock outside years 0–9999).
func (f *file) encode(rec Record) []byte {
	if b, ok := appendPlain(make([]byte, 0, 96+len(rec.Line)), rec); ok {
		return b
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil
	}
	return append(b, '\n')
}

// appendPlain appends what json.Marshal makes of an output record, and a
// newline, without reflection, when it is plain: every string printable
// ASCII that JSON keeps as it is. It reports false for any other record.
func appendPlain(b []byte, rec Record) ([]byte, bool) {
	if rec.ExitCode != nil || rec.Time.IsZero() || rec.Time.Year() < 1000 || rec.Time.Year() > 9999 ||
		!plain(rec.Stream) || !plain(rec.Line) || !plain(rec.InvocationID) {
		return b, false
	}
	b = append(b, `{"time":"`...)
	b = rec.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if rec.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(rec.Attempt), 10)
	}
	b = append(append(append(b, `,"stream":"`...), rec.Stream...), '"')
	if rec.Line != "" {
		b = append(append(append(b, `,"line":"`...), rec.Line...), '"')
	}
	if rec.InvocationID != "" {
		b = append(append(append(b, `,"invocationId":"`...), rec.InvocationID...), '"')
	}
	return append(b, "}\n"...), true
}

// plain reports whether json.Marshal keeps s as it is inside quotes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// openLocked opens the file at the first write, learning how much an
// earlier attempt or registration (maybe of another process) wrote, and
// whether that filled it. It reports whether there is a file to write to.
// f.mu is held.
func (f *file) openLocked() bool {
	if f.fd != nil {
		return true
	}
	if f.failed {
		return false
	}
	f.path = filepath.Join(f.fs.dir, f.name+".log")
	fd, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err == nil {
		var fi os.FileInfo
		if fi, err = fd.Stat(); err != nil {
			_ = fd.Close()
		} else {
			f.fd, f.size = fd, fi.Size()
			if f.size >= MaxBytes-maxRecord {
				f.full, f.marked = true, f.tailMarked()
				f.dropping.Store(f.marked)
			}
			return true
		}
	}
	f.fail(err)
	return false
}

// tailMarked reports whether the end of a full log holds its truncation
// record: only exit records (at most exitReserve) follow it.
func (f *file) tailMarked() bool {
	r, err := os.Open(f.path)
	if err != nil {
		return false
	}
	defer r.Close()
	n := min(f.size, exitReserve+4<<10)
	tail := make([]byte, n)
	if _, err := r.ReadAt(tail, f.size-n); err != nil {
		return false
	}
	return bytes.Contains(tail, markerBytes)
}

func (f *file) appendLocked(b []byte) {
	f.buf = append(f.buf, b...)
	f.size += int64(len(b))
}

// flushLocked writes the buffer in one append. f.mu is held.
func (f *file) flushLocked() {
	if len(f.buf) == 0 || f.fd == nil {
		return
	}
	if _, err := f.fd.Write(f.buf); err != nil {
		f.fail(err)
	}
	f.buf = f.buf[:0]
	if cap(f.buf) > 4*flushAt {
		f.buf = nil // a burst past the bound is not kept
	}
}

// fail stops the file's output after a failed open or write, saying so
// once in the server's log.
func (f *file) fail(err error) {
	if !f.failed {
		f.fs.log.Warn("run log: cannot write; dropping this run's output", "run_uid", f.name, "error", err)
	}
	f.failed = true
	f.full, f.marked = true, true
	f.dropping.Store(true)
	if f.fd != nil {
		_ = f.fd.Close()
		f.fd = nil
	}
}
