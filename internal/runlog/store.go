package runlog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"

	"stoke.dev/stoke/internal/logging"
)

// Store is the directory of Run logs as `stoke up` serves them: it reads
// and removes them, and, while Run runs, tells followers when any of them
// grew. The Runtime Servers write them.
type Store struct {
	dir string
	log *slog.Logger

	mu sync.Mutex
	// changed is closed and replaced whenever a log is written, waking
	// followers.
	changed chan struct{}
}

// New returns the store of the logs under dir, creating it (mode 0700:
// the logs hold the Runs' output).
func New(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run logs: %w", err)
	}
	log = logging.OrDiscard(log)
	return &Store{dir: dir, log: log, changed: make(chan struct{})}, nil
}

// Run watches the directory with inotify until ctx ends, waking followers
// on every write and on an overflow of the event queue, which may have
// lost writes. Without inotify (its limits exhausted) it says so and
// returns nil: followers then rely on their own polling.
func (s *Store) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(s.dir); err != nil {
			_ = w.Close()
		}
	}
	if err != nil {
		s.log.Warn("run logs: not watching for writes; log followers poll", "dir", s.dir, "error", err)
		return nil
	}
	defer w.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Write) || ev.Has(fsnotify.Create) {
				s.wake()
			}
		case _, ok := <-w.Errors:
			if !ok {
				return nil
			}
			s.wake()
		}
	}
}

func (s *Store) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Dir is the directory the Runtime Servers write the logs to.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) string { return filepath.Join(s.dir, name+".log") }

// Remove deletes the log of the Run uid (the Run is gone).
func (s *Store) Remove(uid string) {
	if checkName(uid) != nil {
		return
	}
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("run log: cannot remove", "run_uid", uid, "error", err)
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
	if checkName(uid) != nil {
		return &Reader{}, nil
	}
	r := &Reader{path: s.path(uid)}
	f, err := os.Open(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: opening its log: %w", uid, err)
	}
	r.f = f
	return r, nil
}
