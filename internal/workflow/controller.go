package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// errorRetry is when a WorkflowRun whose writes failed is decided again.
const errorRetry = time.Second

// artifactWorkers bounds the artifact copies in flight at once.
const artifactWorkers = 4

// progressDelay is how long a WorkflowRun's status may lag its steps'
// starts (a step Run gone Running, the job's pod learnt): such a change
// alone is written this long after it was first seen, together with
// whatever else changed by then, rather than at once. A short step ends
// within it, and its end writes the start too; a write per start would
// double the status writes, and the write in flight would hold back the
// decision on the step's end (docs/workflows.md, "Status writes").
const progressDelay = 100 * time.Millisecond

// Config configures a Controller.
type Config struct {
	// WorkflowRuns' status is written; Runs are created and cancelled
	// (and, in standalone, deleted with their WorkflowRun); Workflows are
	// read when a WorkflowRun names one.
	WorkflowRuns store.Resource[*v1alpha1.WorkflowRun]
	Workflows    store.Reader[*v1alpha1.Workflow]
	Runs         store.Resource[*v1alpha1.Run]
	// The shared informers; the caller runs them.
	WorkflowRunInformer *informer.Informer[*v1alpha1.WorkflowRun]
	RunInformer         *informer.Informer[*v1alpha1.Run]
	RuntimeInformer     *informer.Informer[*v1alpha1.Runtime]
	// Artifacts carries out upload-artifact and download-artifact
	// (internal/artifact's Mover); nil fails those steps.
	Artifacts Artifacts
	// Defer, when set, holds back the placement of the step Runs a
	// decision creates together until they are all created (the
	// scheduler's Defer, in the same process): a fan-out's first
	// dependants' placements, claims and ends then do not slow the
	// creates of the rest, on which the fan-out's edges wait
	// (docs/workflows.md, "Status writes").
	Defer func(keys []informer.Key) (release func())
	// DeleteRuns deletes the step Runs of a deleted WorkflowRun (stoke up;
	// in Kubernetes the garbage collector does, by owner reference).
	DeleteRuns bool
	// Clock defaults to the real clock; Logger nil discards.
	Clock  clock.Clock
	Logger *slog.Logger
}

// Controller runs WorkflowRuns.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	clk  clock.Clock
	loop *loop.Loop[informer.Key, struct{}, opDone]

	// Owned by the loop goroutine.
	wfs map[informer.Key]*memo
}

// memo is what the controller remembers of one WorkflowRun between syncs.
type memo struct {
	uid string
	// wrote is the WorkflowRun as the controller's last status write
	// returned it, and from the resourceVersion it replaced: while the
	// informer still shows that version, wrote is newer.
	wrote  *v1alpha1.WorkflowRun
	fromRV string
	// held is a status decided but not written yet, because it only
	// records steps' starts (progressDelay), over the WorkflowRun at
	// held.ResourceVersion; due is when it is written anyway.
	held *v1alpha1.WorkflowRun
	due  time.Time
	// notBefore: job instances waiting for their next attempt.
	notBefore map[string]time.Time
	// inflight and done: artifact steps being copied, and copied.
	inflight map[string]bool
	done     map[string]artifactResult
	// layout is the spec laid out for generation layoutGen (layoutFor).
	layout    *layout
	layoutGen int64
}

// layoutFor is the layout of spec and called, the WorkflowRun's at
// generation gen. It is kept for the next decisions while the generation
// stays (a spec edit makes a new one) and the spec came from the
// WorkflowRun itself, its own jobs or its status snapshot; fresh is set
// when it was just read from the Workflows in the store (a run that has
// not started: they may change until it does), and such a layout is made
// anew each time and not kept.
func (m *memo) layoutFor(gen int64, spec *v1alpha1.WorkflowSpec, called map[string]*v1alpha1.WorkflowSpec, fresh bool) *layout {
	if !fresh && m.layout != nil && m.layoutGen == gen {
		return m.layout
	}
	l := newLayout(spec, called)
	m.layout, m.layoutGen = l, gen
	if fresh {
		m.layout = nil
	}
	return l
}

// opDone is an artifact step's end, from a worker.
type opDone struct {
	wf  informer.Key
	uid string
	key string
	res artifactResult
}

// New checks cfg and returns a Controller.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.WorkflowRuns == nil || cfg.Runs == nil:
		return nil, errors.New("workflow: Config.WorkflowRuns and Config.Runs are required")
	case cfg.WorkflowRunInformer == nil || cfg.RunInformer == nil || cfg.RuntimeInformer == nil:
		return nil, errors.New("workflow: the WorkflowRun, Run and Runtime informers are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	c := &Controller{cfg: cfg, log: logging.OrDiscard(cfg.Logger), clk: cfg.Clock, wfs: map[informer.Key]*memo{}}
	c.loop = loop.New(loop.Config[informer.Key, struct{}, opDone]{
		Clock:   cfg.Clock,
		Workers: artifactWorkers,
		Hooks:   loop.Hooks[informer.Key, struct{}, opDone]{Sync: c.sync, Result: c.result},
	})
	return c, nil
}

// Run waits for the informers to sync, then runs WorkflowRuns until ctx
// ends; it returns nil then.
func (c *Controller) Run(ctx context.Context) error {
	for _, synced := range []func(context.Context) error{c.cfg.WorkflowRunInformer.WaitForSync, c.cfg.RunInformer.WaitForSync, c.cfg.RuntimeInformer.WaitForSync} {
		if err := synced(ctx); err != nil {
			return nil
		}
	}
	add := func(wf *v1alpha1.WorkflowRun) { c.loop.Add(informer.KeyOf(wf)) }
	removeWFs := c.cfg.WorkflowRunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.WorkflowRun]{
		AddFunc: add, UpdateFunc: func(_, wf *v1alpha1.WorkflowRun) { add(wf) }, DeleteFunc: add,
	})
	defer removeWFs()
	byRun := func(run *v1alpha1.Run) {
		if name, ok := run.Labels[LabelWorkflowRun]; ok {
			c.loop.Add(informer.Key{Namespace: informer.KeyOf(run).Namespace, Name: name})
		}
	}
	removeRuns := c.cfg.RunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc: byRun, UpdateFunc: func(_, run *v1alpha1.Run) { byRun(run) }, DeleteFunc: byRun,
	})
	defer removeRuns()
	err := c.loop.Run(ctx, nil)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sync decides one WorkflowRun and carries out the decision.
func (c *Controller) sync(ctx context.Context, k informer.Key) {
	wf, ok := c.cfg.WorkflowRunInformer.Get(k.Namespace, k.Name)
	if !ok {
		delete(c.wfs, k)
		if c.cfg.DeleteRuns {
			c.deleteOrphans(ctx, k)
		}
		return
	}
	m := c.wfs[k]
	if m == nil || m.uid != string(wf.UID) {
		m = &memo{uid: string(wf.UID), notBefore: map[string]time.Time{}, inflight: map[string]bool{}, done: map[string]artifactResult{}}
		c.wfs[k] = m
	}
	if m.wrote != nil && wf.ResourceVersion == m.fromRV {
		wf = m.wrote // the informer has not shown the last write yet
	}
	if m.held != nil && m.held.ResourceVersion != wf.ResourceVersion {
		// Written over meanwhile: the starts it held are decided again
		// from the step Runs.
		m.held, m.due = nil, time.Time{}
	}
	if err := c.reconcile(ctx, k, wf, m); err != nil {
		c.log.Warn("workflow: sync failed, will try again", "workflowrun", k.String(), "uid", wf.UID, "error", err)
		c.loop.After(c.clk.Now().Add(errorRetry), k)
	}
}

func (c *Controller) reconcile(ctx context.Context, k informer.Key, wf *v1alpha1.WorkflowRun, m *memo) error {
	if wf.Status.Phase.Terminal() {
		m.inflight, m.done, m.notBefore = map[string]bool{}, map[string]artifactResult{}, map[string]time.Time{}
		m.held, m.due = nil, time.Time{}
		return c.expire(ctx, k, wf)
	}
	invalid, err := c.validate(ctx, wf)
	if err != nil {
		return err
	}
	spec, snapshot := &v1alpha1.WorkflowSpec{}, (*v1alpha1.WorkflowSnapshot)(nil)
	var called map[string]*v1alpha1.WorkflowSpec
	if invalid == "" {
		if spec, called, snapshot, err = c.spec(ctx, wf); err != nil {
			return err
		}
		if n := snapshotSize(snapshot); n > bounds.WorkflowSnapshot {
			invalid = fmt.Sprintf("the Workflows this run executes and calls are %d bytes of JSON, at most %d allowed in its snapshot", n, bounds.WorkflowSnapshot)
			snapshot = nil
		}
	}
	stored := wf
	if m.held != nil {
		wf = m.held
	}
	w := &world{
		now: c.clk.Now(), wf: wf, spec: spec, called: called, invalid: invalid,
		run: func(name string) (*v1alpha1.Run, bool) {
			run, ok := c.cfg.RunInformer.Get(k.Namespace, name)
			if ok && !ownedBy(run, string(wf.UID)) {
				return nil, false
			}
			return run, ok
		},
		server: func(rt string) string {
			if r, ok := c.cfg.RuntimeInformer.Get(k.Namespace, rt); ok {
				return r.Spec.Server
			}
			return ""
		},
		artifact:  func(key string) (artifactResult, bool) { r, ok := m.done[key]; return r, ok },
		copying:   func(key string) bool { return m.inflight[key] },
		notBefore: func(name string) time.Time { return m.notBefore[name] },
	}
	if invalid == "" {
		w.layout = m.layoutFor(stored.Generation, spec, called, snapshot != nil)
	}
	if snapshot != nil && wf.Status.Snapshot == nil {
		wf = wf.DeepCopy()
		wf.Status.Snapshot = snapshot
	}
	p := decide(w)
	if err := c.createRuns(ctx, k, p.create); err != nil {
		return err
	}
	for _, name := range p.cancel {
		if _, err := store.RequestCancel(ctx, c.cfg.Runs, k.Namespace, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("cancel step run %s: %w", name, err)
		}
	}
	for _, op := range p.artifacts {
		c.startArtifact(ctx, k, wf, m, op)
	}
	for name, t := range p.retryAt {
		m.notBefore[name] = t
	}
	if !p.wake.IsZero() {
		c.loop.After(p.wake, k)
	}
	if snapshot != nil && p.status.Snapshot == nil {
		p.status.Snapshot = snapshot
	}
	p.status.Message = bounds.Truncate(p.status.Message, bounds.Message)
	switch starts(&stored.Status, &p.status) {
	case nothing:
		m.held, m.due = nil, time.Time{}
		return nil
	case onlyStarts:
		if m.due.IsZero() {
			m.due = w.now.Add(progressDelay)
		}
		if w.now.Before(m.due) {
			m.held = stored.DeepCopy()
			m.held.Status = p.status
			// Armed each time: an earlier timer (a due since written
			// over) fires, and finds this one not due yet.
			c.loop.After(m.due, k)
			return nil
		}
	}
	next := stored.DeepCopy()
	next.Status = p.status
	m.held, m.due = nil, time.Time{}
	written, err := c.cfg.WorkflowRuns.UpdateStatus(ctx, next)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict) {
			return nil // the informer delivers the newer version, which syncs again
		}
		return fmt.Errorf("status of workflowrun %s: %w", k, err)
	}
	m.wrote, m.fromRV = written, wf.ResourceVersion
	if written.Status.Phase.Terminal() {
		c.log.Info("workflow: finished", "workflowrun", k.String(), "uid", wf.UID, "phase", written.Status.Phase, "message", written.Status.Message)
	}
	return nil
}

// change is what a decision changed in a WorkflowRun's status.
type change int

const (
	nothing    change = iota
	onlyStarts        // steps' starts alone (see starts)
	more              // anything else: written at once
)

// starts compares next with stored: whether it changed nothing, only
// what a step's start records (steps gone from Pending to Running, with
// their start times, and a job's pod learnt from its first step Run; all
// of it read again from the step Runs when it is lost), or more. It
// copies only the job and step lists it must change to compare, and
// compares once.
func starts(stored, next *v1alpha1.WorkflowRunStatus) change {
	if len(stored.Jobs) != len(next.Jobs) {
		return more
	}
	undone := *next
	undone.Jobs = slices.Clone(next.Jobs)
	started := false
	for i := range undone.Jobs {
		was, js := &stored.Jobs[i], &undone.Jobs[i]
		if len(was.Steps) != len(js.Steps) {
			return more
		}
		if was.PodUID == "" && js.PodUID != "" {
			js.Pod, js.PodUID, started = was.Pod, was.PodUID, true
		}
		cloned := false
		for j := range js.Steps {
			if was.Steps[j].Phase == v1alpha1.JobPending && js.Steps[j].Phase == v1alpha1.JobRunning {
				if !cloned {
					js.Steps, cloned = slices.Clone(js.Steps), true
				}
				js.Steps[j].Phase, js.Steps[j].StartTime, started = was.Steps[j].Phase, was.Steps[j].StartTime, true
			}
		}
	}
	switch {
	case !statusEqual(stored, &undone):
		return more
	case started:
		return onlyStarts
	}
	return nothing
}

// statusEqual is equality.Semantic.DeepEqual of two statuses. Every
// decision compares, and the semantic comparison's reflection looks up
// its custom equalities at every value; reflect.DeepEqual is much
// cheaper and implies it (it differs only in taking nil and empty, or
// one instant in two representations, as unequal), so it answers first
// and the semantic one only when it says no.
func statusEqual(a, b *v1alpha1.WorkflowRunStatus) bool {
	return reflect.DeepEqual(a, b) || equality.Semantic.DeepEqual(a, b)
}

// createWorkers bounds the step Run creates in flight at once.
const createWorkers = 32

// createRuns creates runs (AlreadyExists is done: a restarted controller
// adopts), several at once: each is a store round trip, and the Runs of
// one decision (a fan-out's matrix instances) are peers, so none waits
// for the others' round trips (stoke up's store commits concurrent
// writes together; the API server takes them in parallel). When there
// are several, their placement waits until they are all created (or
// failed): Config.Defer.
func (c *Controller) createRuns(ctx context.Context, k informer.Key, runs []*v1alpha1.Run) error {
	if c.cfg.Defer != nil && len(runs) > 1 {
		keys := make([]informer.Key, len(runs))
		for i, run := range runs {
			keys[i] = informer.KeyOf(run)
		}
		defer c.cfg.Defer(keys)()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(createWorkers)
	for _, run := range runs {
		g.Go(func() error {
			if _, err := c.cfg.Runs.Create(gctx, run); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
				return fmt.Errorf("create step run %s: %w", run.Name, err)
			}
			c.log.Debug("workflow: created a step run", "workflowrun", k.String(), "run", run.Name)
			return nil
		})
	}
	return g.Wait()
}

// expire deletes a finished WorkflowRun ttlSecondsAfterFinished after it
// ended (its step Runs go with it).
func (c *Controller) expire(ctx context.Context, k informer.Key, wf *v1alpha1.WorkflowRun) error {
	ttl, end := wf.Spec.TTLSecondsAfterFinished, wf.Status.CompletionTime
	if ttl == nil || end == nil || wf.DeletionTimestamp != nil {
		return nil
	}
	due := end.Add(time.Duration(*ttl) * time.Second)
	if c.clk.Now().Before(due) {
		c.loop.After(due, k)
		return nil
	}
	err := c.cfg.WorkflowRuns.Delete(ctx, k.Namespace, k.Name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(wf.UID)}})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) {
		return fmt.Errorf("delete finished workflowrun %s: %w", k, err)
	}
	c.log.Info("workflow: deleted a finished workflowrun (ttlSecondsAfterFinished)", "workflowrun", k.String(), "uid", wf.UID)
	return nil
}

// validate runs internal/validation's ValidateWorkflowRun, with the
// Workflows it calls read from the store, on a WorkflowRun that has not
// started: a client other than stoke's (kubectl) gets only the CRD's
// checks when it writes one. It returns the refusal (which names the
// field), or an error when a Workflow could not be read (tried again).
func (c *Controller) validate(ctx context.Context, wf *v1alpha1.WorkflowRun) (string, error) {
	if wf.Status.StartTime != nil || len(wf.Status.Jobs) > 0 {
		return "", nil // validated when it started; its snapshot is fixed
	}
	var readErr error
	var get validation.WorkflowGetter
	if c.cfg.Workflows != nil {
		get = func(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error) {
			w, err := c.cfg.Workflows.Get(ctx, namespace, name)
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) && readErr == nil {
				readErr = fmt.Errorf("workflowrun %s/%s (uid %s): %w", wf.Namespace, wf.Name, wf.UID, err)
			}
			return w, err
		}
	}
	// Stoke's own finalizers are refused from clients, not from Stoke.
	check := wf.DeepCopy()
	check.Finalizers = nil
	err := validation.ValidateWorkflowRun(ctx, check, get)
	switch {
	case readErr != nil:
		return "", readErr
	case err != nil:
		return err.Error(), nil
	}
	return "", nil
}

// spec is what the WorkflowRun executes: its own jobs, or the Workflow it
// names, and the Workflows its jobs call, transitively (called, by name).
// They are copied into status.snapshot when it starts, so that editing a
// Workflow changes no running WorkflowRun; snapshot is non-nil when they
// were read now. A called Workflow that is not there is left out: the
// decision's flatten then refuses the run, naming it.
func (c *Controller) spec(ctx context.Context, wf *v1alpha1.WorkflowRun) (spec *v1alpha1.WorkflowSpec, called map[string]*v1alpha1.WorkflowSpec, snapshot *v1alpha1.WorkflowSnapshot, err error) {
	if s := wf.Status.Snapshot; s != nil || wf.Status.StartTime != nil || len(wf.Status.Jobs) > 0 {
		// Started: what it runs is fixed.
		spec = &v1alpha1.WorkflowSpec{Jobs: wf.Spec.Jobs, Env: wf.Spec.Env}
		called = map[string]*v1alpha1.WorkflowSpec{}
		if s != nil {
			if s.Spec != nil {
				spec = s.Spec
			}
			for i := range s.Called {
				called[s.Called[i].Name] = &s.Called[i].Spec
			}
		}
		if wf.Spec.Workflow != "" && (s == nil || s.Spec == nil) {
			return nil, nil, nil, fmt.Errorf("workflowrun %s/%s (uid %s) started without a snapshot of Workflow %s", wf.Namespace, wf.Name, wf.UID, wf.Spec.Workflow)
		}
		return spec, called, nil, nil
	}
	if (wf.Spec.Workflow != "" || hasCalls(wf.Spec.Jobs)) && c.cfg.Workflows == nil {
		return nil, nil, nil, errors.New("no Workflow store")
	}
	snapshot = &v1alpha1.WorkflowSnapshot{}
	spec = &v1alpha1.WorkflowSpec{Jobs: wf.Spec.Jobs, Env: wf.Spec.Env}
	if wf.Spec.Workflow != "" {
		w, err := c.cfg.Workflows.Get(ctx, wf.Namespace, wf.Spec.Workflow)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("workflow %s of workflowrun %s/%s (uid %s): %w", wf.Spec.Workflow, wf.Namespace, wf.Name, wf.UID, err)
		}
		spec = w.Spec.DeepCopy()
		snapshot.Spec = spec
	}
	// Every Workflow called, breadth first; more than the bound are not
	// read (validation refuses such a run before it gets here).
	called = map[string]*v1alpha1.WorkflowSpec{}
	queue := []*v1alpha1.WorkflowSpec{spec}
	for len(queue) > 0 && len(called) <= bounds.WorkflowCalled {
		next := queue[0]
		queue = queue[1:]
		for _, j := range next.Jobs {
			if _, seen := called[j.Uses]; j.Uses == "" || seen {
				continue
			}
			w, err := c.cfg.Workflows.Get(ctx, wf.Namespace, j.Uses)
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				called[j.Uses] = nil
				continue
			case err != nil:
				return nil, nil, nil, fmt.Errorf("workflow %s called by workflowrun %s/%s (uid %s): %w", j.Uses, wf.Namespace, wf.Name, wf.UID, err)
			}
			s := w.Spec.DeepCopy()
			called[j.Uses] = s
			snapshot.Called = append(snapshot.Called, v1alpha1.CalledWorkflow{Name: j.Uses, Spec: *s})
			queue = append(queue, s)
		}
	}
	for name, s := range called {
		if s == nil {
			delete(called, name)
		}
	}
	slices.SortFunc(snapshot.Called, func(a, b v1alpha1.CalledWorkflow) int { return strings.Compare(a.Name, b.Name) })
	if snapshot.Spec == nil && len(snapshot.Called) == 0 {
		return spec, called, nil, nil // its own jobs, calling none: nothing to copy
	}
	return spec, called, snapshot, nil
}

func snapshotSize(s *v1alpha1.WorkflowSnapshot) int {
	if s == nil {
		return 0
	}
	b, err := json.Marshal(s)
	if err != nil {
		return math.MaxInt
	}
	return len(b)
}

func hasCalls(jobs []v1alpha1.Job) bool {
	for _, j := range jobs {
		if j.Uses != "" {
			return true
		}
	}
	return false
}

// startArtifact hands an artifact step's copy to a worker unless it is in
// flight or done.
func (c *Controller) startArtifact(ctx context.Context, k informer.Key, wf *v1alpha1.WorkflowRun, m *memo, op artifactOp) {
	if m.inflight[op.Run] {
		return
	}
	if _, ok := m.done[op.Run]; ok {
		return
	}
	m.inflight[op.Run] = true
	arts, uid := c.cfg.Artifacts, string(wf.UID)
	c.loop.Submit(ctx, func(ctx context.Context) opDone {
		res := artifactResult{err: op.err}
		switch {
		case op.err != nil:
		case arts == nil:
			res.err = errors.New("this control plane has no artifact store")
		default:
			res.message, res.err = arts.Copy(ctx, op.ArtifactCopy)
		}
		if res.err != nil && (op.err != nil || arts == nil) {
			// Nothing could release the hold: end the step Run.
			if _, err := store.RequestCancel(ctx, c.cfg.Runs, op.Namespace, op.Run); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				c.log.Warn("workflow: ending an artifact step", "run", op.Run, "error", err)
			}
		}
		return opDone{wf: k, uid: uid, key: op.Run, res: res}
	})
}

// result takes an artifact step's end back on the loop goroutine.
func (c *Controller) result(_ context.Context, r opDone) {
	m := c.wfs[r.wf]
	if m == nil || m.uid != r.uid {
		return
	}
	delete(m.inflight, r.key)
	m.done[r.key] = r.res
	c.loop.Add(r.wf)
}

// deleteOrphans deletes the step Runs of a WorkflowRun that is gone.
func (c *Controller) deleteOrphans(ctx context.Context, k informer.Key) {
	runs := c.cfg.RunInformer.List(func(run *v1alpha1.Run) bool {
		return run.Labels[LabelWorkflowRun] == k.Name && informer.KeyOf(run).Namespace == k.Namespace && controllerKind(run) == v1alpha1.KindWorkflowRun
	})
	for _, run := range runs {
		err := c.cfg.Runs.Delete(ctx, k.Namespace, run.Name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(run.UID)}})
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			c.log.Warn("workflow: deleting a step run of a deleted workflowrun", "workflowrun", k.String(), "run", run.Name, "run_uid", run.UID, "error", err)
			c.loop.After(c.clk.Now().Add(errorRetry), k)
		}
	}
}

func controllerKind(run *v1alpha1.Run) string {
	for _, o := range run.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			return o.Kind
		}
	}
	return ""
}

// ownedBy reports whether run is controlled by the WorkflowRun with uid.
func ownedBy(run *v1alpha1.Run, uid string) bool {
	for _, o := range run.OwnerReferences {
		if o.Kind == v1alpha1.KindWorkflowRun && o.Controller != nil && *o.Controller {
			return string(o.UID) == uid
		}
	}
	return false
}
