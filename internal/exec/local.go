package exec

import (
	"context"
	"log/slog"
	"sync"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/runuser"
)

// Target is where a session runs: a live task execution or function
// registration on this Runtime Server.
type Target struct {
	Dir string   // absolute working directory
	Env []string // the Run's complete environment, "K=V"
	// Ended is closed when the Run's execution ends or its registration
	// is released or replaced; Reason then says which.
	Ended  <-chan struct{}
	Reason func() string
	// Attach, for a task started with stdin or a terminal, is its own
	// process, for attach sessions (Request.Attach); nil otherwise.
	Attach *Attachment
}

// Targets resolves a Run on this Runtime Server. Its errors are NotFound
// (no such Run), NotRunning (the task finished) and FailedPrecondition (a
// stale registration ID).
type Targets interface {
	ExecTarget(runUID, registrationID string) (Target, error)
}

// Scopes tracks what each session starts beyond its own session (a
// process that called setsid and was orphaned): proc.Subreaper. A process
// started with proc.ScopeEnv=name belongs to scope name between Begin and
// End, and End kills what is left of it.
type Scopes interface {
	Begin(name string)
	End(name string)
}

// LocalConfig configures a Local executor.
type LocalConfig struct {
	Targets Targets
	// Scopes, when set, gives each session a scope of its own.
	Scopes Scopes
	Logger *slog.Logger
	// MaxPerRun and MaxTotal bound concurrent sessions (defaults
	// bounds.ExecSessionsPerRun and bounds.ExecSessionsPerServer).
	MaxPerRun, MaxTotal int
	// User, when set, is the unprivileged user the commands run as, as
	// the Runs' own processes do (a server running as root); their
	// terminal is handed to it too. Nil: as this process.
	User *runuser.User
}

// Local runs exec sessions on this machine: each command is the leader of
// a session of its own (with a TTY, the terminal's controlling session),
// which is killed whole when the exec ends, when its Run ends or its
// registration is replaced, and on Close.
type Local struct {
	cfg LocalConfig
	log *slog.Logger

	mu     sync.Mutex
	perRun map[string]int
	total  int
	live   map[slot]struct{}
	closed bool
}

// NewLocal returns a Local executor.
func NewLocal(cfg LocalConfig) *Local {
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.MaxPerRun <= 0 {
		cfg.MaxPerRun = bounds.ExecSessionsPerRun
	}
	if cfg.MaxTotal <= 0 {
		cfg.MaxTotal = bounds.ExecSessionsPerServer
	}
	return &Local{cfg: cfg, log: cfg.Logger, perRun: map[string]int{}, live: map[slot]struct{}{}}
}

// Start validates req, finds its Run, takes a slot and starts the command.
func (l *Local) Start(_ context.Context, req Request) (Session, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	target, err := l.cfg.Targets.ExecTarget(req.RunUID, req.RegistrationID)
	if err != nil {
		return nil, err
	}
	if req.Attach {
		return l.startAttach(req, target)
	}
	s := &localSession{l: l, req: req, target: target, log: l.log.With("run_uid", req.RunUID)}
	if err := l.acquire(s); err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		l.release(s)
		return nil, err
	}
	return s, nil
}

// slot is an open session, counted against Local's bounds.
type slot interface {
	runUID() string
	Close() error
}

func (l *Local) acquire(s slot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return errdefs.Errorf(errdefs.ErrUnavailable, "run %s: exec: the runtime server is shutting down", s.runUID())
	case l.total >= l.cfg.MaxTotal:
		return errdefs.Errorf(errdefs.ErrResourceExhausted, "run %s: exec: %d sessions are open on this runtime server, the most allowed", s.runUID(), l.cfg.MaxTotal)
	case l.perRun[s.runUID()] >= l.cfg.MaxPerRun:
		return errdefs.Errorf(errdefs.ErrResourceExhausted, "run %s: exec: %d sessions are open into this run, the most allowed", s.runUID(), l.cfg.MaxPerRun)
	}
	l.total++
	l.perRun[s.runUID()]++
	l.live[s] = struct{}{}
	return nil
}

func (l *Local) release(s slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.live[s]; !ok {
		return
	}
	delete(l.live, s)
	l.total--
	if l.perRun[s.runUID()]--; l.perRun[s.runUID()] == 0 {
		delete(l.perRun, s.runUID())
	}
}

// Open returns the number of open sessions.
func (l *Local) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Close refuses new sessions and ends every open one, killing its
// processes.
func (l *Local) Close() {
	l.mu.Lock()
	l.closed = true
	live := make([]slot, 0, len(l.live))
	for s := range l.live {
		live = append(live, s)
	}
	l.mu.Unlock()
	for _, s := range live {
		_ = s.Close()
	}
}
