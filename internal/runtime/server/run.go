package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runtime/bash"
	"stoke.dev/stoke/internal/runtime/python"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/shm"
)

// Config configures one Runtime Server process.
type Config struct {
	Runtime string // "bash" or "python"
	// Adapter, when set, is served instead of the built-in adapter that
	// Runtime names (the lambda runtime brings its own).
	Adapter runtime.Adapter
	// Exec, when set, makes the exec service of an adapter whose Runs do
	// not run on this machine (lambda: through each Run's reverse agent),
	// given the core's targets, which say whether a Run is live here;
	// nil runs sessions here (exec.Local).
	Exec func(exec.Targets) exec.Executor
	// Collectors are more metrics to serve (the lambda agents').
	Collectors    []prometheus.Collector
	Listen        string // host:port
	WorkspaceRoot string // every working_dir must lie inside it
	// StateDir holds private per-registration and per-execution files;
	// empty means a fresh temporary directory removed on exit.
	StateDir string
	// RunLogDir receives each Run's program output as RUN_UID.log (see
	// internal/runlog); empty means StateDir/run-logs. The server's own log
	// carries events only.
	RunLogDir string
	// IPCDir holds the request files and FIFOs of warm Bash functions;
	// empty means a fresh private directory on /dev/shm when that is a
	// writable tmpfs (else inside StateDir), removed on exit. One given is
	// removed on exit if it is empty by then.
	IPCDir string
	// Python is the interpreter for the python runtime, resolved once to
	// its real executable so that version-manager shims stay off the hot
	// path.
	Python string
	Bash   string
	// PythonDeps is the cache of the python runtime's requirements
	// (internal/pydeps), shared by the Runtime's servers; empty: a
	// requirements.txt is not installed. PipFindLinks, when set, is a
	// wheel directory pip installs from alone (--no-index).
	PythonDeps, PipFindLinks string
	// HandlerEnv is added to every handler's and task's environment,
	// beneath its Run's own env: the Runtime's env (HandlerEnvFrom).
	HandlerEnv map[string]string

	DefaultInvokeTimeout time.Duration
	MaxInvokeTimeout     time.Duration
	MaxTaskDuration      time.Duration
	InitTimeout          time.Duration
	// ShutdownGrace is how long in-flight work may finish after SIGTERM
	// before its processes are killed.
	ShutdownGrace time.Duration

	// Subreaper makes the server the child subreaper of its work, so that
	// the processes a task or an invocation leaves behind (setsid, a double
	// fork, a daemon) are found and killed when it ends, and everything at
	// exit (proc.Subreaper). `stoke runtime-server` sets it; a server run
	// inside another program (a test) must not, as that program's other
	// children would be taken for orphans.
	Subreaper bool
	// Containment is Auto to run each task in a cgroup v2 of its own
	// under this server's cgroup, where that is usable (cgroup.Detect), as
	// well as the subreaper; Subreaper (or empty) for the subreaper alone.
	// Only with Subreaper set.
	Containment cgroup.Mode

	// RunAs, when set, is the unprivileged user the Runs' processes run
	// as — tasks, handlers and exec sessions — while the server itself
	// stays root to contain and kill them (internal/runuser). It needs a
	// server running as root. The directories between the workspace and
	// state directories' own and what the user is given are passages;
	// the user reaches nothing else of the server's.
	RunAs *runuser.User

	Logger *slog.Logger
	// OnListen, if set, is called with the bound address once the server
	// accepts connections (the listen address may use port 0).
	OnListen func(net.Addr)
}

// Listen listens on addr: "host:port" for TCP, or "unix:PATH" (also
// "unix://PATH") for a Unix socket, which a supervisor on the same machine
// can name in advance. A stale socket file is replaced.
func Listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		path = strings.TrimPrefix(path, "//")
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		lis, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
		return lis, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return lis, nil
}

// NewAdapter returns the built-in adapter for name; deps, with a Root,
// is the python runtime's requirements cache (its Python is the adapter's).
func NewAdapter(ctx context.Context, name, pythonPath, bashPath string, deps pydeps.Config) (runtime.Adapter, error) {
	switch name {
	case "bash":
		return bash.New(bash.Config{BashPath: bashPath}), nil
	case "python":
		interp, err := python.ResolveInterpreter(ctx, pythonPath)
		if err != nil {
			return nil, err
		}
		var cache *pydeps.Cache
		if deps.Root != "" {
			deps.Python = interp
			if cache, err = pydeps.New(deps); err != nil {
				return nil, err
			}
		}
		return python.New(python.Config{Interpreter: interp, Deps: cache, Spare: true}), nil
	}
	return nil, fmt.Errorf("unknown runtime %q: want bash or python", name)
}

// Run serves a Runtime Server until ctx ends, then drains and exits.
func Run(ctx context.Context, cfg Config) error {
	log := logging.OrDiscard(cfg.Logger)
	log = log.With("runtime", cfg.Runtime)
	if cfg.IPCDir != "" {
		// A pod's, made and recorded by its pool, which removes it when the
		// pod ends; but the pool of a stoke up killed with SIGKILL never
		// does, while this server stops on its parent-death signal (even
		// before it serves) and releases every registration, whose
		// directories go with it. Only an empty directory is removed: it
		// may be one a user named.
		defer os.Remove(cfg.IPCDir)
	}
	// A Runtime Server whose supervisor dies gets SIGTERM (its
	// parent-death signal) and drains, logging as it goes to a pipe that
	// nobody reads any more. Go ends a program that writes to a broken
	// pipe on fd 1 or 2 with SIGPIPE, which would cut the drain short and
	// leave the process groups of its work running, unless SIGPIPE is
	// notified: then the write fails with EPIPE and the drain goes on.
	// (signal.Ignore would do too, but an ignored signal stays ignored
	// across exec, in every handler; a notified one is reset.) Nothing
	// reads the channel: a signal that finds it full is dropped.
	sigpipe := make(chan os.Signal, 1)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	defer signal.Stop(sigpipe)
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	adapter := cfg.Adapter
	if adapter == nil {
		var err error
		python, bash := cfg.Python, cfg.Bash
		if cfg.RunAs != nil {
			// Programs the Runs' user can run, not only the server.
			if python, err = cfg.RunAs.LookPath(cmp.Or(python, "python3"), os.Getenv("PATH")); err != nil && cfg.Runtime == "python" {
				return err
			}
			if bash, err = cfg.RunAs.LookPath(cmp.Or(bash, "bash"), os.Getenv("PATH")); err != nil && cfg.Runtime == "bash" {
				return err
			}
		}
		deps := pydeps.Config{Root: cfg.PythonDeps, FindLinks: cfg.PipFindLinks, Logger: log}
		if adapter, err = NewAdapter(ctx, cfg.Runtime, python, bash, deps); err != nil {
			return err
		}
	}
	// After NewAdapter, whose interpreter probe is not started by proc.
	var scopes runtime.Scopes
	stopReaper := func() {}
	if cfg.Subreaper {
		reaper, err := proc.NewSubreaper(log)
		if err != nil {
			return err
		}
		scopes = reaper
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = reaper.Run(rctx)
		}()
		var once sync.Once
		stopReaper = func() {
			once.Do(func() {
				cancel()
				<-done
				if err := reaper.Sweep(2 * time.Second); err != nil {
					log.Warn("orphans left at exit", "error", err)
				}
			})
		}
		defer stopReaper()
	}
	var taskCgroup *cgroup.Group
	if cfg.Subreaper && cfg.Containment == cgroup.Auto {
		var err error
		if taskCgroup, err = cgroup.Detect(); err != nil {
			log.Info("no cgroup v2 of our own; containment by the subreaper alone", "reason", err)
			taskCgroup = nil
		} else {
			log.Info("each task runs in a cgroup v2 of its own", "parent", taskCgroup.Path())
		}
	}
	if cfg.WorkspaceRoot == "" {
		return errors.New("a workspace root is required")
	}
	if cfg.RunAs != nil && os.Geteuid() != 0 {
		return fmt.Errorf("--run-as-user %s: the runtime server runs as uid %d, and only root can start processes as another user", cfg.RunAs, os.Geteuid())
	}
	if err := os.MkdirAll(cfg.WorkspaceRoot, 0o700); err != nil {
		return fmt.Errorf("workspace root: %w", err)
	}
	if err := cfg.RunAs.Passage(cfg.WorkspaceRoot); err != nil {
		return fmt.Errorf("workspace root: %w", err)
	}
	ws, err := runtime.NewWorkspace(cfg.WorkspaceRoot)
	if err != nil {
		return err
	}
	stateDir := cfg.StateDir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "stoke-runtime-"); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		defer os.RemoveAll(stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := cfg.RunAs.Passage(stateDir); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	ipcDir := cfg.IPCDir
	if ipcDir == "" {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		if ipcDir, err = shm.MkdirTemp(stateDir, "stoke-ipc-"); err != nil {
			return fmt.Errorf("ipc dir: %w", err)
		}
		defer os.RemoveAll(ipcDir)
	}
	runLogDir := cfg.RunLogDir
	if runLogDir == "" {
		runLogDir = filepath.Join(stateDir, "run-logs")
	}
	logs, err := runlog.NewFiles(runLogDir, log, nil)
	if err != nil {
		return err
	}
	fns, err := runtime.NewFunctions(runtime.FunctionsConfig{
		Adapter: adapter, Workspace: ws, ScratchRoot: stateDir + "/functions", IPCRoot: ipcDir, Logger: log, Logs: logs,
		DefaultInvokeTimeout: cfg.DefaultInvokeTimeout, MaxInvokeTimeout: cfg.MaxInvokeTimeout,
		InitTimeout: cfg.InitTimeout, Scopes: scopes, User: cfg.RunAs, BaseEnv: cfg.HandlerEnv,
	})
	if err != nil {
		return err
	}
	maxTask := cfg.MaxTaskDuration
	if maxTask <= 0 {
		maxTask = bounds.MaxTaskDuration
	}
	tasks, err := runtime.NewTasks(runtime.TasksConfig{
		Adapter: adapter, Workspace: ws, ScratchRoot: stateDir + "/tasks", Logger: log, Logs: logs,
		MaxTaskDuration: maxTask, Scopes: scopes, Cgroup: taskCgroup, User: cfg.RunAs, BaseEnv: cfg.HandlerEnv,
		Self: self(),
	})
	if err != nil {
		return err
	}
	lis, err := Listen(cfg.Listen)
	if err != nil {
		return err
	}
	targets := runtime.ExecTargets(tasks, fns)
	execs := exec.NewLocal(exec.LocalConfig{Targets: targets, Scopes: scopes, Logger: log, User: cfg.RunAs})
	var executor exec.Executor = execs
	if cfg.Exec != nil {
		executor = cfg.Exec(targets)
	}
	metrics := NewMetrics(fns.RegistrationStates)
	metrics.reg.MustRegister(cfg.Collectors...)
	g := NewGRPC(log, Services{Runtime: tasks, Functions: fns, Exec: exec.NewGRPCServer(executor), Metrics: metrics})
	log.Info("runtime server listening", "addr", lis.Addr().String(), "workspace_root", ws.Root(), "run_log_dir", runLogDir,
		"gomaxprocs", goruntime.GOMAXPROCS(0), "run_as_user", cfg.RunAs.String())
	if cfg.OnListen != nil {
		cfg.OnListen(lis.Addr())
	}
	err = g.Serve(ctx, lis, cfg.ShutdownGrace, func() {
		// Invocations in flight may finish within the grace and are then
		// cancelled; one-shot executions get SIGTERM at once and SIGKILL
		// after the grace. The RPCs waiting on them return, so
		// GracefulStop can complete.
		execs.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			fns.Close(cfg.ShutdownGrace)
		}()
		tasks.Close(cfg.ShutdownGrace)
		<-done
	})
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	// What the drain could not reach — a handler's job that took a process
	// group of its own, an orphan — is still in this pod's session.
	if killed, kerr := proc.KillRestOfOwnSession(2 * time.Second); len(killed) > 0 || kerr != nil {
		log.Info("killed what was left of the pod's session", "pids", killed, "error", kerr)
	}
	// What left the session too has been orphaned to this server by now.
	stopReaper()
	log.Info("runtime server stopped")
	return err
}

// self is this executable's path, for tasks that run Stoke's own program
// (runtime.SelfCommand); "" when it cannot be found.
func self() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}
