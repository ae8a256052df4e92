// Package runtimed is the per-pod daemon: it claims the Runs the scheduler
// assigned to its pod, materialises their source, drives the pod's Runtime
// Server (task: Execute/Wait/Forget; function: Register/Status/Unregister),
// writes bounded status, enforces function lifetime and idle timeouts, and
// serves the FunctionRuntime proxy hop through which the gateway invokes
// Ready functions. It never executes user code itself.
package runtimed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/store"
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
	// Metrics, when set, get the dispatch latencies (NewMetrics).
	Metrics *Metrics
}

// Daemon is one pod's runtimed.
type Daemon struct {
	cfg       Config
	log       *slog.Logger
	runtime   pb.RuntimeClient
	functions pb.FunctionRuntimeClient

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
	return &Daemon{
		ctx:       ctx,
		cancel:    cancel,
		cfg:       cfg,
		log:       cfg.Logger.With("pod", cfg.Pod.Name, "pod_uid", cfg.Pod.UID),
		runtime:   pb.NewRuntimeClient(cfg.Conn),
		functions: pb.NewFunctionRuntimeClient(cfg.Conn),
		workers:   map[string]*worker{},
		active:    map[string]*pb.FunctionRegistration{},
		ended:     map[string]struct{}{},
	}
}

// Run serves until ctx ends, then stops every worker (their executions
// and registrations are left to the pod's own shutdown) and returns.
func (d *Daemon) Run(ctx context.Context) error {
	<-ctx.Done()
	d.mu.Lock()
	d.cancel() // no new workers from here on; running ones stop
	d.mu.Unlock()
	d.wg.Wait()
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

// workDir is the Run's working directory inside the pod's workspace.
func (d *Daemon) workDir(uid string) string {
	return filepath.Join(d.cfg.Pod.WorkspaceRoot, uid)
}

// worker drives one Run on this pod.
type worker struct {
	d      *Daemon
	uid    string
	log    *slog.Logger
	cancel context.CancelFunc

	mu      sync.Mutex
	latest  *v1alpha1.Run
	deleted bool
	updates chan struct{} // signalled when latest changes
	// executing is closed once a task's execution was started on the
	// Runtime Server, so that an exec can wait for it.
	executing chan struct{}
	// adopted is set for a Run a previous runtimed claimed (Adopt).
	adopted bool
	// taken is when this runtimed took the Run (the dispatch latency's
	// start).
	taken time.Time
}

func (w *worker) update(run *v1alpha1.Run) {
	w.mu.Lock()
	w.latest = run
	w.mu.Unlock()
	w.signal()
}

// wrote records what the worker's own write of base stored, unless the
// informer handed over another version while the write was in flight:
// that one is the stored version itself or a later one (a delete, a
// cancel), and overwriting it would lose that change for good, as no
// further event brings it back. Versions are compared for equality only;
// Kubernetes keeps them opaque.
func (w *worker) wrote(base, stored *v1alpha1.Run) {
	w.mu.Lock()
	if w.latest.ResourceVersion == base.ResourceVersion {
		w.latest = stored
	}
	w.mu.Unlock()
	w.signal()
}

func (w *worker) signal() {
	select {
	case w.updates <- struct{}{}:
	default:
	}
}

// markDeleted hands the worker the Run's last state, gone for good; under
// w.mu, as current reads it.
func (w *worker) markDeleted(run *v1alpha1.Run) {
	w.mu.Lock()
	w.deleted = true
	w.mu.Unlock()
	w.update(run)
}

func (w *worker) current() (*v1alpha1.Run, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.deleted
}

// stopRequested reports whether the Run is being cancelled or deleted.
func (w *worker) stopRequested() (cancel, deleted bool) {
	run, gone := w.current()
	return run.Spec.CancelRequested, gone || run.DeletionTimestamp != nil
}

func (w *worker) run(ctx context.Context) {
	if w.adopted {
		// Claimed and materialised by the previous runtimed; its
		// execution or registration may still be on the Runtime Server.
		run, _ := w.current()
		dir := w.d.workDir(w.uid)
		defer w.removeDir(ctx, dir)
		w.log.Info("adopting a run claimed by the previous runtimed", "phase", run.Status.Phase)
		if run.Spec.Mode.Function != nil {
			w.runFunction(ctx, run, dir)
			return
		}
		w.runTask(ctx, run, dir)
		return
	}
	// Claim: Scheduled → Running with startTime. A conflict means the Run
	// moved on (cancelled, reassigned): re-read and decide again. A
	// function requeued after a restart keeps its first startTime: its
	// reservation lifetime counts from there (a retry clears it).
	now := metav1.NewTime(w.d.cfg.Now())
	claimed, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		if r.Status.Phase != v1alpha1.PhaseScheduled {
			return false
		}
		r.Status.Phase = v1alpha1.PhaseRunning
		if r.Status.StartTime == nil {
			r.Status.StartTime = &now
		}
		r.Status.Reason, r.Status.Message = "", ""
		return true
	})
	if err != nil || claimed == nil {
		if err != nil && ctx.Err() == nil {
			w.log.Warn("claiming run", "error", err)
		}
		return
	}
	run := claimed
	dir := w.d.workDir(w.uid)
	defer w.removeDir(ctx, dir)
	if err := materialise(w.d.cfg.WorkDirs, dir, run.Spec.Source); err != nil {
		w.fail(ctx, retry.InvalidSpec, fmt.Sprintf("materialising source: %v", err))
		return
	}
	if run.Spec.Mode.Function != nil {
		w.runFunction(ctx, run, dir)
		return
	}
	w.runTask(ctx, run, dir)
}

// removeDir removes the Run's working directory once the worker is done
// with the Run. When the daemon stops first, what the Run started stays on
// the pod (see Run), and so does its directory: the pod's end removes it,
// or a restarted runtimed adopts the Run.
func (w *worker) removeDir(ctx context.Context, dir string) {
	if ctx.Err() != nil {
		return
	}
	if err := w.d.cfg.WorkDirs.Remove(dir); err != nil {
		w.log.Warn("removing working directory", "error", err)
	}
}

// setStatus applies mutate to the freshest copy of the Run and writes it
// with optimistic concurrency, re-reading on conflict. mutate returns false
// when the change no longer applies (the Run moved on); setStatus then
// returns nil. A Run no longer assigned to this pod, or terminal, is never
// changed.
func (w *worker) setStatus(ctx context.Context, mutate func(*v1alpha1.Run) bool) (*v1alpha1.Run, error) {
	// Every attempt mutates its own copy of the freshest Run known, so
	// that an attempt that failed leaves nothing behind for the next.
	base, _ := w.current()
	var updated *v1alpha1.Run
	err := w.whileStoreUnavailable(ctx, ctx, "runs/status", func(ctx context.Context) error {
		return store.RetryOnConflict(func() error {
			run := base.DeepCopy()
			if run.Status.AssignedPodUID != w.d.cfg.Pod.UID || run.Status.Phase.Terminal() || !mutate(run) {
				return nil
			}
			w.hidePaths(&run.Status)
			u, err := w.d.cfg.Runs.UpdateStatus(ctx, run)
			if err == nil {
				w.wrote(base, u)
				updated = u
				return nil
			}
			if errors.Is(err, errdefs.ErrNotFound) {
				return w.goneOrWait(err)
			}
			if !errors.Is(err, errdefs.ErrConflict) {
				return err
			}
			fresh, gerr := w.d.cfg.Runs.Get(ctx, run.Namespace, run.Name)
			if gerr != nil {
				if errors.Is(gerr, errdefs.ErrNotFound) {
					return w.goneOrWait(gerr)
				}
				return fmt.Errorf("re-read after conflict: %w", gerr)
			}
			if string(fresh.UID) != w.uid {
				return nil // a new Run of the same name
			}
			base = fresh
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: update status: %w", w.uid, err)
	}
	return updated, nil
}

// goneOrWait decides what a NotFound from the store means for this Run:
// nothing to write when the informer has reported the Run gone, else a
// reason to try again (an error wrapping errdefs.ErrUnavailable). An API
// server that is starting answers NotFound for a custom resource it does
// not serve yet; a Run that is really gone reaches the worker from the
// informer (OnDelete).
func (w *worker) goneOrWait(err error) error {
	if _, gone := w.current(); gone {
		return nil
	}
	return fmt.Errorf("run %s: the store says %w, its informer has not seen it go: %w", w.uid, err, errdefs.ErrUnavailable)
}

// fail sends a failure through the retry engine and records its decision.
func (w *worker) fail(ctx context.Context, reason retry.Reason, message string) {
	_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		d := retry.Decide(r, reason, bounds.Truncate(message, bounds.Message), w.d.cfg.Now())
		retry.Apply(r, d)
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("recording failure", "reason", reason, "error", err)
	}
	w.log.Info("run failed", "reason", reason, "message", bounds.Truncate(message, 512))
}

// finish records a terminal phase that is not a failure to retry.
func (w *worker) finish(ctx context.Context, phase v1alpha1.Phase, reason, message string, edit func(*v1alpha1.Run)) {
	now := metav1.NewTime(w.d.cfg.Now())
	_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		r.Status.Phase = phase
		r.Status.Reason = reason
		r.Status.Message = bounds.Truncate(message, bounds.Message)
		r.Status.CompletionTime = &now
		if edit != nil {
			edit(r)
		}
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("recording completion", "phase", phase, "error", err)
	}
}

// whileUnavailable calls f until it returns anything but Unavailable. The
// pod's own Runtime Server is unavailable only while it restarts or dies;
// the calls runtimed makes are idempotent (Execute and Register by ID and
// attempt) or reads, and runtimed's context ends when the pod is declared
// gone — then the reaper, not runtimed, decides the Run's fate.
func whileUnavailable(ctx context.Context, f func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := f()
		if status.Code(err) != codes.Unavailable {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// storeCallTimeout bounds one attempt at a store write (with the reads of
// its conflict retries): a request to an API server that went away, or
// that accepted it while starting, may otherwise never be answered.
const storeCallTimeout = 10 * time.Second

// whileStoreUnavailable calls f, with a context derived from call and
// bounded by storeCallTimeout, until the store answers it: while the store
// is unreachable (errdefs.ErrUnavailable, or a call that ran out of time —
// the API server is down or restarting) or refuses it (see storeDown) it
// tries again with backoff until wait ends. runtimed's writes are the only
// record of what happened on the pod (a task's exit and outputs, a
// function's registration), so they wait for the store rather than being
// lost. A refusal is logged, with resource (what f writes) and the error,
// when it begins or changes and once when it ends: past an API server's
// start it means runtimed's RBAC or credentials are wrong, and retried in
// silence it would leave the Run stuck with nothing saying why.
func (w *worker) whileStoreUnavailable(wait, call context.Context, resource string, f func(ctx context.Context) error) error {
	backoff := 50 * time.Millisecond
	var refused error // the refusal's category while one is being retried
	for {
		ctx, cancel := context.WithTimeout(call, storeCallTimeout)
		err := f(ctx)
		cancel()
		if r := refusal(err); r != refused {
			if r != nil {
				w.log.Error("the store refuses runtimed's write; retrying (check runtimed's RBAC and its Pod's ServiceAccount token)",
					"resource", resource, "error", err)
			} else {
				w.log.Info("the store no longer refuses runtimed's write", "resource", resource, "error", err)
			}
			refused = r
		}
		if !storeDown(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-wait.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// refusal is err's category when the store refused the call (401, 403),
// nil otherwise.
func refusal(err error) error {
	for _, c := range []error{errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated} {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

// storeDown reports whether err says the store could not be reached, or
// refused the call: a kube-apiserver that has just started answers 401 and
// 403 until its authenticator and RBAC authorizer have synced, and a claim
// refused then would leave its Run Scheduled for good.
func storeDown(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrDeadlineExceeded) || refusal(err) != nil
}
