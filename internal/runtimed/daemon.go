// Package runtimed is the per-pod daemon: it claims the Runs the scheduler
// assigned to its pod, materialises their source, drives the pod's Runtime
// Server (task: Execute/Wait/Forget; function: Register/Status/Unregister),
// writes bounded status, enforces function lifetime and idle timeouts, and
// serves the FunctionRuntime proxy hop through which the gateway invokes
// Ready functions. It never executes user code itself.
package runtimed

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// Finalizer is set on function Runs while runtimed holds a registration for
// them, so that a delete first drains and unregisters.
const Finalizer = v1alpha1.FinalizerRuntimed

// Config configures one runtimed.
type Config struct {
	Pod  podsource.Pod
	Runs store.Resource[*v1alpha1.Run]
	// Conn is a client connection to the pod's Runtime Server.
	Conn   grpc.ClientConnInterface
	Logger *slog.Logger
	Now    func() time.Time
	// StatusPoll is how often a function's FunctionStatus is read for
	// failures and idle time; at most one second.
	StatusPoll time.Duration
	// WorkDirs, when set, makes and removes the Runs' working directories
	// (in Pod.WorkspaceRoot; emptied ones are kept for the next Runs); nil
	// makes and removes each.
	WorkDirs *runtime.DirPool
	// Endpoint returns a Ready function's invoke URL for status.endpoint.
	Endpoint func(run *v1alpha1.Run) string
	// Defaults from the Runtime: task and function timeouts when a Run has
	// none (zero: the Runtime Server's maximum for tasks, no lifetime limit
	// for functions).
	DefaultTaskTimeout     time.Duration
	DefaultFunctionTimeout time.Duration
	// RunLogs, when set, is the directory of the Runs' logs that this
	// daemon removes a Run's log from when the Run leaves it (deleted, or
	// given to another pod); in Kubernetes mode the logs live in the Pod.
	RunLogs *runlog.Store
	// RunningAfter, when positive, defers a task's claim (the write of
	// Running) until the task has run that long: a task that ends sooner
	// is written once, at its end (Scheduled → Succeeded, with its
	// startTime), as a kubelet batches a short Pod's status. Zero claims
	// each task before it starts. Kubernetes mode sets it; see
	// docs/runtimed.md "The claim" for what fences a task instead.
	RunningAfter time.Duration
	// StateDir, when set, is runtimed's own directory on the pod: kept
	// while the pod lives (across runtimed's restarts) and out of the
	// Runs' reach (Kubernetes mode: an emptyDir of the runtimed container
	// alone). It holds the marks that fence a deferred claim in a shared
	// workspace (taken.go); without it such tasks are claimed before
	// they start.
	StateDir string
	// Metrics, when set, get the dispatch latencies (NewMetrics).
	Metrics *Metrics
	// Git is the git cache spec.source.git is fetched into; nil fails
	// Runs with a git source.
	Git *gitsource.Cache
	// GitSecret, when set (Kubernetes mode), is the rule for a Run's
	// source.git.credentialsSecret: it must be *GitSecret, the Runtime's
	// spec.git.credentialsSecret, whose credentials Git holds (a Run
	// naming another fails InvalidSpec, as the pod holds no other
	// Secret), and only a Run naming it fetches with them. Nil (stoke
	// up) ignores the name: Git's credentials apply by URL.
	GitSecret *string
}

// Daemon is one pod's runtimed.
type Daemon struct {
	cfg       Config
	log       *slog.Logger
	runtime   pb.RuntimeClient
	functions pb.FunctionRuntimeClient
	// proxy is the one proxy hop (Proxy): standalone's gateway asks for
	// it on every invocation.
	proxy *proxy

	mu      sync.Mutex
	workers map[string]*worker // by Run UID
	active  map[string]*pb.FunctionRegistration
	// ended and endedOrder are the Runs whose worker ended, for log
	// followers (logs.go).
	ended      map[string]struct{}
	endedOrder []string
	// ctx exists from New on, so that Runs handed over before Run starts
	// are not lost; Run cancels it when its own context ends.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// spares makes the git cache's spare checkouts (nil without Git).
	spares *spares
	// taken is the directory of the marks of taken Runs (taken.go); ""
	// without Config.StateDir.
	taken string
}

// New returns a Daemon; Run starts it.
func New(cfg Config) *Daemon {
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StatusPoll <= 0 || cfg.StatusPoll > time.Second {
		cfg.StatusPoll = time.Second
	}
	if cfg.Endpoint == nil {
		cfg.Endpoint = func(run *v1alpha1.Run) string {
			return fmt.Sprintf("/v1/namespaces/%s/runs/%s/%s/invoke", run.Namespace, run.Name, run.UID)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("pod", cfg.Pod.Name, "pod_uid", cfg.Pod.UID)
	d := &Daemon{
		ctx:       ctx,
		spares:    newSpares(ctx, cfg.Git, log),
		cancel:    cancel,
		cfg:       cfg,
		log:       log,
		runtime:   pb.NewRuntimeClient(cfg.Conn),
		functions: pb.NewFunctionRuntimeClient(cfg.Conn),
		workers:   map[string]*worker{},
		active:    map[string]*pb.FunctionRegistration{},
		ended:     map[string]struct{}{},
	}
	d.proxy = &proxy{d: d}
	d.taken = d.initTaken()
	return d
}

// Run serves until ctx ends, then stops every worker (their executions
// and registrations are left to the pod's own shutdown) and returns.
func (d *Daemon) Run(ctx context.Context) error {
	<-ctx.Done()
	d.mu.Lock()
	d.cancel() // no new workers from here on; running ones stop
	d.mu.Unlock()
	d.wg.Wait()
	d.spares.close()
	return nil
}

// OnRun tells the daemon about the current state of a Run (from the shared
// informer). Runs assigned elsewhere are ignored; a new assignment starts a
// worker; an update is handed to the running worker. A nil run with a UID
// means it was deleted.
func (d *Daemon) OnRun(run *v1alpha1.Run) {
	if run == nil || run.Status.AssignedPodUID != d.cfg.Pod.UID {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		return
	}
	uid := string(run.UID)
	if w := d.workers[uid]; w != nil {
		w.update(run)
		return
	}
	if run.Status.Phase != v1alpha1.PhaseScheduled || run.Status.Phase.Terminal() {
		return
	}
	d.startWorkerLocked(run, false)
}

// OnPlaced tells the daemon about the current state of a Run placed on
// its pod at the Run's create (placement.Unclaimed) that no one has
// written yet: a new one starts a worker, which writes the assignment
// with its claim (no Scheduled write before it); an update reaches the
// worker only while what the worker knows is unwritten too, so that a
// Run heard of from two informers (the sidecar's placed and assigned
// ones) never goes back to an older version. Other Runs are ignored.
// With Pod.Slots known, a Run that would overfill the pod is left to the
// scheduler, which assigns it when a slot frees.
func (d *Daemon) OnPlaced(run *v1alpha1.Run) {
	if run == nil || placement.Unclaimed(run) != d.cfg.Pod.UID {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		return
	}
	if w := d.workers[string(run.UID)]; w != nil {
		w.updateUnclaimed(run)
		return
	}
	if run.DeletionTimestamp != nil {
		return
	}
	if s := d.cfg.Pod.Slots; s > 0 && len(d.workers) >= int(s) {
		d.log.Debug("a run placed on this pod would overfill it: left to the scheduler", "run_uid", run.UID, "slots", s)
		return
	}
	d.startWorkerLocked(run, false)
}

// holds reports whether run is this pod's: assigned to it, or placed on
// it at its create and not written yet.
func (d *Daemon) holds(run *v1alpha1.Run) bool {
	return run.Status.AssignedPodUID == d.cfg.Pod.UID || placement.Unclaimed(run) == d.cfg.Pod.UID
}

// Adopt takes over the Runs of this pod that a previous runtimed process
// claimed and left running on the pod's Runtime Server (a Running task, a
// registering or Ready function): the sidecar calls it once, with its
// informer's first list, when its container restarted while the Pod lived
// on. A task whose execution the Runtime Server still knows is waited for
// again; one it does not know fails as ExecutionLost (the retry engine
// decides). A function is registered again with the same attempt, which
// the Runtime Server answers with the registration it holds. Runs that
// already have a worker, and those of other pods, are left alone.
func (d *Daemon) Adopt(runs []*v1alpha1.Run) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		return
	}
	for _, run := range runs {
		p := run.Status.Phase
		if run.Status.AssignedPodUID != d.cfg.Pod.UID || d.workers[string(run.UID)] != nil ||
			(p != v1alpha1.PhaseRunning && p != v1alpha1.PhaseReady) {
			continue
		}
		d.startWorkerLocked(run, true)
	}
	d.sweepTakenLocked(runs)
}

// startWorkerLocked starts the worker of run; d.mu is held.
func (d *Daemon) startWorkerLocked(run *v1alpha1.Run, adopt bool) {
	uid := string(run.UID)
	ctx, cancel := context.WithCancel(d.ctx)
	w := &worker{d: d, uid: uid, cancel: cancel, updates: make(chan struct{}, 1), latest: run, executing: make(chan struct{}), adopted: adopt, taken: d.cfg.Now(),
		log: d.log.With("run_uid", uid, "run", run.Namespace+"/"+run.Name, "attempt", run.Status.Attempt)}
	d.workers[uid] = w
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer cancel()
		w.run(ctx)
		d.mu.Lock()
		if d.workers[uid] == w {
			delete(d.workers, uid)
			d.workerEnded(uid)
		}
		d.mu.Unlock()
	}()
}

// OnDelete tells the daemon a Run object is gone.
func (d *Daemon) OnDelete(run *v1alpha1.Run) {
	if d.cfg.RunLogs != nil {
		d.cfg.RunLogs.Remove(string(run.UID))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[string(run.UID)]; w != nil {
		gone := run.DeepCopy()
		gone.DeletionTimestamp = &metav1.Time{Time: d.cfg.Now()}
		w.markDeleted(gone)
	}
}

// workDir is the Run's working directory inside the pod's workspace: its
// own, named by its UID, or, with spec.placement.workspace, the shared
// workspace of that name (shared true), "ws-NAME", which no UID can be
// (UIDs are UUIDs: no 'w'). The name was validated at create and is
// checked again here, so it can name nothing outside the root.
func (d *Daemon) workDir(run *v1alpha1.Run) (dir string, shared bool, err error) {
	pl := run.Spec.Placement
	if pl == nil || pl.Workspace == "" {
		return filepath.Join(d.cfg.Pod.WorkspaceRoot, string(run.UID)), false, nil
	}
	if err := validation.WorkspaceName("spec.placement.workspace", pl.Workspace); err != nil {
		return "", true, err
	}
	return filepath.Join(d.cfg.Pod.WorkspaceRoot, workspacePrefix+pl.Workspace), true, nil
}

// workspacePrefix starts a shared workspace's directory name.
const workspacePrefix = "ws-"
