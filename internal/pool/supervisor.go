package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/store"
)

// Defaults for Config.
const (
	DefaultHealthInterval = time.Second
	DefaultCheckTimeout   = time.Second
	DefaultUnhealthyAfter = 3
	DefaultStartTimeout   = 30 * time.Second
	DefaultShutdownGrace  = 5 * time.Second
	DefaultStatusInterval = 10 * time.Second
)

// Replacement backoff: after a pod of a pool fails (exits, turns unhealthy
// or never becomes ready) the next start of that pool waits backoffBase,
// doubling per failure in a row up to backoffMax. A pod that was ready for
// backoffMax before it failed starts the count afresh.
const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 10 * time.Second
)

// killSlack is how long past its --shutdown-grace a Runtime Server that was
// sent SIGTERM may take before it is killed.
const killSlack = 5 * time.Second

// socketName is the Runtime Server's socket inside its pod directory.
const socketName = "rs.sock"

// DebugSocketName is the Runtime Server's debug socket (its
// --debug-socket, internal/debugsock) inside its pod directory, which is
// 0700: <DataDir>/pods/<pod name>/debug.sock.
const DebugSocketName = "debug.sock"

// maxSocketPath is the longest Unix socket path the kernel accepts
// (sockaddr_un.sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// Config configures a Supervisor.
type Config struct {
	// Store holds the Runtime objects the supervisor follows and whose
	// status it writes. Required.
	Store store.Store
	// DataDir is where pods live: <DataDir>/pods/<name>/ holds a pod's
	// sockets and records (the supervisor owns <DataDir>/pods and clears
	// it on start, after killing what is left of the pods an earlier
	// supervisor recorded there), <DataDir>/scratch/<name> is its
	// Runtime Server's --state-dir (cleared on start too), and
	// <DataDir>/runs is the one workspace root shared by all pods, which
	// runtimed fills with a directory per Run. Required.
	DataDir string
	// Command builds the command for a pod's Runtime Server; args start
	// with "runtime-server". The default runs this executable with args.
	// The supervisor starts it with proc.Start, in a session of its own,
	// and sets its stdout and stderr (when nil) to a pipe that it logs
	// line by line.
	Command func(pod podsource.Pod, args []string) *exec.Cmd
	// Logger receives the supervisor's logs and the pods' own logs (their
	// events; the Runs' output goes to RunLogDir). Nil discards them.
	Logger *slog.Logger
	// RunLogDir is the pods' --run-log-dir, where each Runtime Server
	// writes the Runs' output (internal/runlog). Empty leaves it to the
	// Runtime Server: inside the pod's directory, removed with the pod.
	RunLogDir string
	// HealthInterval is the time between two health checks of a pod.
	HealthInterval time.Duration
	// CheckTimeout bounds one health check.
	CheckTimeout time.Duration
	// UnhealthyAfter is how many failed health checks in a row fence a pod.
	UnhealthyAfter int
	// StartTimeout bounds the time from starting a Runtime Server until it
	// answers its health check; a pod that takes longer is killed and
	// replaced.
	StartTimeout time.Duration
	// ShutdownGrace is the Runtime Server's --shutdown-grace: how long
	// work in flight may finish after SIGTERM. The supervisor kills a pod
	// that has not exited ShutdownGrace+5s after SIGTERM.
	ShutdownGrace time.Duration
	// StatusInterval is how often status.pods[].lastHeartbeat is refreshed
	// in the store; readiness changes are written at once.
	StatusInterval time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// DebugSockets gives each pod's Runtime Server a debug socket
	// (DebugSocketName in its pod directory) serving Go's profiles.
	DebugSockets bool
	// Cgroup, when set, is the cgroup v2 this supervisor owns for its pods:
	// each pod starts directly in a child group of it (recorded in the
	// pod's directory first), which is killed with cgroup.kill and removed
	// when the pod ends, and the pod's Runtime Server puts each task in a
	// child of that (--containment auto). Nil: pods run in this process's
	// cgroup with --containment subreaper.
	Cgroup *cgroup.Group
	// RunAs, when set, is the unprivileged user the pods' Runs run as
	// (their Runtime Servers' --run-as-user; this process is root). The
	// workspace root <DataDir>/runs and the pods' scratch directories
	// <DataDir>/scratch/<pod name> are then passages it can go through
	// but not list (internal/runuser); <DataDir>/pods, with the pods'
	// sockets, stays private.
	RunAs *runuser.User
}

// Supervisor keeps the runtime pods of every Runtime object running. Create
// it with NewSupervisor and drive it with Run; Subscribe, Pods and Lookup
// may be called from any goroutine, before, during and after Run.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	clk     clock.WithTicker
	podsDir string
	runsDir string
	// scratchDir holds each pod's --state-dir: its Runs' scratch
	// directories, apart from the pod's directory and its sockets.
	scratchDir string
	running    atomic.Bool

	hub *podsource.Hub
}

// NewSupervisor checks cfg, fills in its defaults and returns a Supervisor
// that does nothing until Run.
func NewSupervisor(cfg Config) (*Supervisor, error) {
	if cfg.Store == nil {
		return nil, errors.New("pool: a store is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("pool: a data directory is required")
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pool: data directory: %w", err)
	}
	cfg.DataDir = dataDir
	if cfg.Command == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("pool: find the stoke executable: %w", err)
		}
		cfg.Command = func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(exe, args...) }
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	setDefault(&cfg.HealthInterval, DefaultHealthInterval)
	setDefault(&cfg.CheckTimeout, DefaultCheckTimeout)
	setDefault(&cfg.StartTimeout, DefaultStartTimeout)
	setDefault(&cfg.ShutdownGrace, DefaultShutdownGrace)
	setDefault(&cfg.StatusInterval, DefaultStatusInterval)
	if cfg.UnhealthyAfter <= 0 {
		cfg.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Supervisor{
		cfg:        cfg,
		log:        cfg.Logger,
		clk:        cfg.Clock,
		podsDir:    filepath.Join(dataDir, "pods"),
		runsDir:    filepath.Join(dataDir, "runs"),
		scratchDir: filepath.Join(dataDir, "scratch"),
		hub:        podsource.NewHub(cfg.Logger),
	}, nil
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Subscribe is podsource.Hub's Subscribe: the ready pods and their later
// transitions. After Run has returned the channel is closed once the
// subscriber has received every queued event.
func (s *Supervisor) Subscribe() (events <-chan podsource.Event, snapshot []podsource.Pod, cancel func()) {
	return s.hub.Subscribe()
}

// Pods returns the pods announced ready and not yet gone, sorted by name
// (a pod being stopped stays until its PodGone).
func (s *Supervisor) Pods() []podsource.Pod { return s.hub.Pods() }

// Lookup returns the pod with this UID if it was announced ready and is
// not yet gone.
func (s *Supervisor) Lookup(uid string) (podsource.Pod, bool) { return s.hub.Lookup(uid) }

// Run follows the Runtime objects in the store and keeps spec.replicas pods
// running for each until ctx ends. Then it stops every pod (SIGTERM, then
// SIGKILL after ShutdownGrace+5s), announces each as gone with reason
// Shutdown, writes the final status, and returns once every child process
// has been reaped and every goroutine it started has ended. It returns nil
// after a shutdown, or an error when it cannot start at all. Run may be
// called once.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("pool: Run called twice")
	}
	defer s.hub.End()
	if err := os.MkdirAll(s.runsDir, 0o700); err != nil {
		return fmt.Errorf("pool: workspace root: %w", err)
	}
	if err := s.cfg.RunAs.Passage(s.runsDir); err != nil {
		return fmt.Errorf("pool: workspace root: %w", err)
	}
	// Pod directories left by an earlier supervisor belong to pods that
	// died with it: their Runtime Servers got a parent-death signal and
	// drained. What they could not reach is killed here.
	s.killLeftovers()
	if err := os.RemoveAll(s.podsDir); err != nil {
		return fmt.Errorf("pool: clear pods directory: %w", err)
	}
	if err := os.MkdirAll(s.podsDir, 0o700); err != nil {
		return fmt.Errorf("pool: pods directory: %w", err)
	}
	// The earlier pods' scratch directories went with their Runs.
	if err := os.RemoveAll(s.scratchDir); err != nil {
		return fmt.Errorf("pool: clear scratch directory: %w", err)
	}
	if err := s.cfg.RunAs.Passage(s.scratchDir); err != nil {
		return fmt.Errorf("pool: scratch directory: %w", err)
	}
	l := &loop{
		s:       s,
		pools:   make(map[types.UID]*pool),
		current: make(map[rtKey]*pool),
		reports: make(chan podReport),
		status:  newStatusWriter(s.cfg.Store.Runtimes(), s.log, s.clk),
		retry:   s.clk.NewTimer(time.Hour),
	}
	l.retry.Stop()
	return l.run(ctx)
}

// killLeftovers kills what is left of the sessions of the pods that an
// earlier supervisor on this data directory recorded (its sidFile) and
// did not stop: processes in process groups their Runtime Server did not
// know of (job control), or everything, if the server died before it
// could drain. A record whose leader's pid now belongs to another process
// is skipped (proc.Session.Kill).
func (s *Supervisor) killLeftovers() {
	entries, err := os.ReadDir(s.podsDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot list the pods of an earlier supervisor", "err", err)
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		log := s.log.With("pod", e.Name())
		if err := removeRecordedIPC(filepath.Join(s.podsDir, e.Name())); err != nil {
			log.Warn("cannot remove the IPC directory of an earlier pod", "err", err)
		}
		s.removeRecordedCgroup(filepath.Join(s.podsDir, e.Name()), log)
		b, err := os.ReadFile(filepath.Join(s.podsDir, e.Name(), sidFile))
		if errors.Is(err, fs.ErrNotExist) {
			continue // it died before it was recorded, taking nothing along
		}
		if err != nil {
			log.Warn("cannot read the session of an earlier pod", "err", err)
			continue
		}
		sess, err := proc.ParseSession(string(b))
		if err != nil {
			log.Warn("cannot read the session of an earlier pod", "err", err)
			continue
		}
		killed, err := sess.Kill(fenceWait)
		if len(killed) > 0 {
			log.Warn("killed processes left by an earlier pod", "session", sess.ID, "pids", killed)
		}
		if err != nil {
			log.Error("cannot kill what is left of an earlier pod", "session", sess.ID, "err", err)
		}
	}
}
