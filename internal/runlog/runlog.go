// Package runlog keeps each Run's program output — a task's stdout and
// stderr, a function's handler output — as a bounded file of JSON records
// in the data directory, fed from the runtime pods' structured logs, and
// serves it to readers that may follow it as it grows.
package runlog

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/internal/logging"
)

// MaxBytes bounds one Run's output in its log file; past it a truncation
// record is written once and later output stays in the server's own log.
const MaxBytes = 8 << 20

// exitReserve is the room past MaxBytes kept for exit records, so that a
// truncated log still says how each attempt ended (one record of about a
// hundred bytes per attempt, at most 100 attempts).
const exitReserve = 64 << 10

// maxOpen bounds the log files held open for appending.
const maxOpen = 64

// Streams of a record.
const (
	StreamStdout    = "stdout"
	StreamStderr    = "stderr"
	StreamExit      = "exit"
	StreamTruncated = "truncated"
)

// Record is one line of a Run's log, as stored and as served.
type Record struct {
	Time         time.Time `json:"time,omitzero"`
	Attempt      int32     `json:"attempt,omitempty"`
	Stream       string    `json:"stream"`
	Line         string    `json:"line,omitempty"`
	InvocationID string    `json:"invocationId,omitempty"`
	// ExitCode is set on the exit record that ends a task attempt.
	ExitCode *int32 `json:"exitCode,omitempty"`
}

// Store is the directory of Run logs.
type Store struct {
	dir string
	log *slog.Logger

	mu    sync.Mutex
	files map[string]*file // by Run UID, the open ones
	lru   *list.List       // of *file, most recent at the front
	// changed is closed and replaced on every write, waking followers.
	changed chan struct{}
}

type file struct {
	uid       string
	f         *os.File
	size      int64
	truncated bool
	elem      *list.Element
}

// New returns the store of the logs under dir, creating it.
func New(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run logs: %w", err)
	}
	log = logging.OrDiscard(log)
	return &Store{dir: dir, log: log, files: map[string]*file{}, lru: list.New(), changed: make(chan struct{})}, nil
}

func (s *Store) path(uid string) string { return filepath.Join(s.dir, uid+".log") }

// validUID keeps a UID from naming a path outside the directory.
func validUID(uid string) bool {
	return uid != "" && len(uid) <= 128 && !strings.ContainsAny(uid, "/\\\x00") && uid != "." && uid != ".."
}

// podLine is the part of a Runtime Server's slog record that carries a
// Run's output: tasks log msg "output" with execution_id "UID.ATTEMPT",
// stream and line, and "execution finished" with exit_code; functions log
// msg "output" with run_uid, invocation_id, stream and line.
type podLine struct {
	Time         time.Time `json:"time"`
	Msg          string    `json:"msg"`
	RunUID       string    `json:"run_uid"`
	ExecutionID  string    `json:"execution_id"`
	InvocationID string    `json:"invocation_id"`
	Stream       string    `json:"stream"`
	Line         string    `json:"line"`
	ExitCode     *int32    `json:"exit_code"`
}

// Ingest takes one JSON log line of a runtime pod and files it in its Run's
// log if it is program output. Other lines are ignored.
func (s *Store) Ingest(line []byte) {
	// Cheap filter first: most lines are not output.
	if !bytes.Contains(line, []byte(`"msg":"output"`)) && !bytes.Contains(line, []byte(`"msg":"execution finished"`)) {
		return
	}
	var pl podLine
	if json.Unmarshal(line, &pl) != nil {
		return
	}
	rec := Record{Time: pl.Time, InvocationID: pl.InvocationID}
	uid := pl.RunUID
	if pl.ExecutionID != "" {
		// One execution per task attempt: "UID.ATTEMPT".
		i := strings.LastIndexByte(pl.ExecutionID, '.')
		if i <= 0 {
			return
		}
		n, err := strconv.ParseInt(pl.ExecutionID[i+1:], 10, 32)
		if err != nil {
			return
		}
		uid, rec.Attempt = pl.ExecutionID[:i], int32(n)
	}
	switch pl.Msg {
	case "output":
		if pl.Stream != StreamStdout && pl.Stream != StreamStderr {
			return
		}
		rec.Stream, rec.Line = pl.Stream, pl.Line
	case "execution finished":
		if pl.ExecutionID == "" {
			return
		}
		code := int32(-1)
		if pl.ExitCode != nil {
			code = *pl.ExitCode
		}
		rec.Stream, rec.ExitCode = StreamExit, &code
	default:
		return
	}
	s.Append(uid, rec)
}

// Append writes rec to the log of the Run uid.
func (s *Store) Append(uid string, rec Record) {
	if !validUID(uid) {
		return
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	b = append(b, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.open(uid)
	if err != nil {
		s.log.Warn("run log: cannot open", "run_uid", uid, "error", err)
		return
	}
	switch {
	case rec.Stream == StreamExit:
		if f.size+int64(len(b)) > MaxBytes+exitReserve {
			return
		}
	case f.truncated:
		return
	case f.size+int64(len(b)) > MaxBytes:
		f.truncated = true
		b, _ = json.Marshal(Record{Time: time.Now(), Attempt: rec.Attempt, Stream: StreamTruncated,
			Line: fmt.Sprintf("the log reached its bound of %d bytes; later output is in the server log only", MaxBytes)})
		b = append(b, '\n')
	}
	n, err := f.f.Write(b)
	f.size += int64(n)
	if err != nil {
		s.log.Warn("run log: cannot write", "run_uid", uid, "error", err)
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// open returns the open file of uid, opening it and closing the least
// recently used past maxOpen. s.mu is held.
func (s *Store) open(uid string) (*file, error) {
	if f := s.files[uid]; f != nil {
		s.lru.MoveToFront(f.elem)
		return f, nil
	}
	fh, err := os.OpenFile(s.path(uid), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	f := &file{uid: uid, f: fh, size: fi.Size(), truncated: fi.Size() >= MaxBytes}
	f.elem = s.lru.PushFront(f)
	s.files[uid] = f
	for s.lru.Len() > maxOpen {
		s.closeFile(s.lru.Back().Value.(*file))
	}
	return f, nil
}

func (s *Store) closeFile(f *file) {
	s.lru.Remove(f.elem)
	delete(s.files, f.uid)
	_ = f.f.Close()
}

// Remove deletes the log of the Run uid (the Run is gone).
func (s *Store) Remove(uid string) {
	if !validUID(uid) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[uid]; f != nil {
		s.closeFile(f)
	}
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("run log: cannot remove", "run_uid", uid, "error", err)
	}
}

// Close closes every open file.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		s.closeFile(f)
	}
}

// Changed returns a channel closed at the next write to any log; a follower
// takes it before reading, so no write between its read and its wait is
// missed.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Open opens the log of the Run uid for reading from the start. A Run that
// has written nothing yet has an empty log.
func (s *Store) Open(uid string) (*Reader, error) {
	if !validUID(uid) {
		return &Reader{}, nil
	}
	f, err := os.Open(s.path(uid))
	if errors.Is(err, fs.ErrNotExist) {
		return &Reader{uid: uid, s: s}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: opening its log: %w", uid, err)
	}
	return &Reader{uid: uid, s: s, f: f}, nil
}

// Reader reads a Run's log in whole lines, picking up what is appended.
type Reader struct {
	s       *Store
	uid     string
	f       *os.File
	partial []byte // a line whose end is not written yet
}

// Next returns the complete lines appended since the last call (each with
// its newline), at most about max bytes at a time, or nil when there are
// none yet.
func (r *Reader) Next(max int) ([]byte, error) {
	if r.f == nil {
		if r.s == nil {
			return nil, nil
		}
		f, err := os.Open(r.s.path(r.uid))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		r.f = f
	}
	buf := make([]byte, max)
	n, err := r.f.Read(buf)
	if n == 0 {
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return nil, nil
	}
	data := append(r.partial, buf[:n]...)
	i := bytes.LastIndexByte(data, '\n')
	if i < 0 {
		r.partial = data
		return nil, nil
	}
	r.partial = append([]byte(nil), data[i+1:]...)
	return data[:i+1], nil
}

// Close closes the reader.
func (r *Reader) Close() error {
	if r.f == nil {
		return nil
	}
	return r.f.Close()
}
