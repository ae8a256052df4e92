package functionset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/store"
)

// Condition types and reasons on a Function's status.
const (
	// ConditionReplicaFailure is True while replicas keep dying: its
	// message names the last one and why.
	ConditionReplicaFailure = "ReplicaFailure"
)

// Timing of the controller's own retries.
const (
	// firstBackoff is the delay before replacing a replica after the
	// first that died since one was last Ready; it doubles per death up
	// to bounds.MaxBackoff.
	firstBackoff = time.Second
	// errorRetry is when a Function whose writes failed is looked at
	// again.
	errorRetry = time.Second
	// LoadRefresh is how often, given a Load source, the controller
	// looks at a Function's load again.
	LoadRefresh = time.Second
	// StatusDelay is how long a change of a Function's status waits
	// before it is written, so that the changes of a scale from zero (a
	// replica counted, the new generation observed, the replica Ready)
	// go in one write once the path's own API writes are done, not each
	// beside them on the API server; it also bounds a Function's status
	// writes to one per StatusDelay (docs/functions.md).
	StatusDelay = 250 * time.Millisecond
	// expectTimeout is how long a created replica that the informer has
	// not shown yet is still counted (a watch that lags, or a create
	// whose answer was lost).
	expectTimeout = 30 * time.Second
)

// Config configures a Controller.
type Config struct {
	// Functions and Runs are written: replica Runs created, annotated and
	// deleted, Function status updated.
	Functions store.Resource[*v1alpha1.Function]
	Runs      store.Resource[*v1alpha1.Run]
	// FunctionInformer and RunInformer are shared informers; the caller
	// runs them.
	FunctionInformer *informer.Informer[*v1alpha1.Function]
	RunInformer      *informer.Informer[*v1alpha1.Run]
	// Drained, when set, tells whether no dispatcher has an invocation in
	// flight on a draining replica (namespace, Function name, Run UID), so
	// that it may be deleted before drainSeconds. Standalone's one
	// gateway can say; with several gateways the time bound rules.
	Drained func(namespace, function, runUID string) bool
	// Load, when set, is the dispatcher's in-flight and queued
	// invocations of a Function (standalone's one gateway): the
	// controller writes them to status.inFlight and status.queued,
	// looking again every LoadRefresh (a write only when they changed).
	// Unset, those fields are left to whoever else writes them.
	Load func(namespace, name string) (inFlight, queued int)
	// Created, when set, is told of each replica as its create returned
	// it (the scheduler's Created, in the same process), so that it is
	// assigned without waiting for the Run watch to deliver it: a scale
	// from zero waits for that assignment. It must not block.
	Created func(run *v1alpha1.Run)
	// Place, when set, reserves a slot for a replica before its create
	// (the scheduler's Place, in the same process), which is then
	// created placed on that pod (placement.Place): its pod's runtimed
	// takes it as created, and writes its assignment with its claim and
	// Ready, one API write less before a scale from zero's first answer.
	// Unplace gives the slot back when the create failed. Both or
	// neither.
	Place   func(ctx context.Context, namespace, name, runtime string) (podUID string, ok bool)
	Unplace func(namespace, name string)
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger: nil discards.
	Logger *slog.Logger
}

// Controller keeps Functions' replica Runs.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	clk  clock.Clock
	loop *loop.Loop[informer.Key, struct{}, struct{}]

	// Owned by the loop goroutine.
	fns map[informer.Key]*state

	// expected are desired counts on their way to the store (Expect);
	// scaled are the autoscaler's decisions for status.lastScale
	// (Record), until the informer shows them written.
	mu       sync.Mutex
	expected map[informer.Key]expectation
	scaled   map[informer.Key]scaleRecord
}

// scaleRecord is a scale decision of the Function with this UID.
type scaleRecord struct {
	uid types.UID
	d   v1alpha1.ScaleDecision
}

// expectation is a desired count written and not yet seen.
type expectation struct {
	uid      types.UID
	replicas int
	at       time.Time
}

// state is what the controller remembers of one Function between syncs.
type state struct {
	uid string
	// created are replicas created and not yet seen in the informer
	// (name → when), counted so that a sync before the watch delivers
	// them does not create them again.
	created map[string]time.Time
	// marked are replicas marked draining whose mark the informer has
	// not shown yet (UID → when), so that a sync on the older copy does
	// not pick more replicas to drain; dead are the ended replicas already
	// counted, until the informer shows them gone.
	marked map[types.UID]time.Time
	dead   map[types.UID]bool
	// deaths counts replicas that ended since one was last Ready;
	// notBefore is when the next replacement may be created.
	deaths    int
	notBefore time.Time
	failure   string // the last death, for the ReplicaFailure condition
	// statusDue is when the status change first found and not yet
	// written goes (zero: none waits).
	statusDue time.Time
}

// New checks cfg and returns a Controller.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.Functions == nil || cfg.Runs == nil:
		return nil, errors.New("functionset: Config.Functions and Config.Runs are required")
	case cfg.FunctionInformer == nil || cfg.RunInformer == nil:
		return nil, errors.New("functionset: Config.FunctionInformer and Config.RunInformer are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	c := &Controller{cfg: cfg, log: logging.OrDiscard(cfg.Logger), clk: cfg.Clock, fns: map[informer.Key]*state{},
		expected: map[informer.Key]expectation{}, scaled: map[informer.Key]scaleRecord{}}
	c.loop = loop.New(loop.Config[informer.Key, struct{}, struct{}]{
		Clock: cfg.Clock,
		Hooks: loop.Hooks[informer.Key, struct{}, struct{}]{Sync: c.sync},
	})
	return c, nil
}

// Run waits for both informers to sync, then keeps every Function's
// replicas until ctx ends; it returns nil then.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.cfg.FunctionInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	if err := c.cfg.RunInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	removeFns := c.cfg.FunctionInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Function]{
		AddFunc:    func(fn *v1alpha1.Function) { c.loop.Add(informer.KeyOf(fn)) },
		UpdateFunc: func(_, fn *v1alpha1.Function) { c.loop.Add(informer.KeyOf(fn)) },
		DeleteFunc: func(fn *v1alpha1.Function) { c.loop.Add(informer.KeyOf(fn)) },
	})
	defer removeFns()
	byRun := func(run *v1alpha1.Run) {
		if name, ok := run.Labels[v1alpha1.LabelFunction]; ok {
			c.loop.Add(informer.Key{Namespace: informer.KeyOf(run).Namespace, Name: name})
		}
	}
	removeRuns := c.cfg.RunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    byRun,
		UpdateFunc: func(_, run *v1alpha1.Run) { byRun(run) },
		DeleteFunc: byRun,
	})
	defer removeRuns()
	err := c.loop.Run(ctx, nil)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Expect says that a desired count of replicas for the Function
// namespace/name with this UID is on its way to spec.replicas (the
// autoscaler's write): until the informer shows spec.replicas at least
// that high, or expectTimeout passes, the controller keeps that many
// replicas (within scale.max) when spec.replicas asks for fewer, so that
// a scale up, and a scale from zero above all, does not wait for the
// write to come back through the informer. It only ever adds replicas;
// replicas 0 withdraws the expectation (the write failed), and the
// replicas made for it then go as too many. It never blocks and may be
// called from any goroutine.
func (c *Controller) Expect(namespace, name string, uid types.UID, replicas int) {
	if namespace == "" {
		namespace = store.DefaultNamespace
	}
	k := informer.Key{Namespace: namespace, Name: name}
	c.mu.Lock()
	if replicas > 0 {
		c.expected[k] = expectation{uid: uid, replicas: replicas, at: c.clk.Now()}
	} else {
		delete(c.expected, k)
	}
	c.mu.Unlock()
	c.loop.Add(k)
}

// Record says that the autoscaler scaled the Function namespace/name
// with this UID (its spec.replicas write returned): d goes to
// status.lastScale with the controller's next status write, StatusDelay
// after the scale's other status changes began, in the same write. A
// later Record replaces it. It never blocks and may be called from any
// goroutine.
func (c *Controller) Record(namespace, name string, uid types.UID, d v1alpha1.ScaleDecision) {
	if namespace == "" {
		namespace = store.DefaultNamespace
	}
	k := informer.Key{Namespace: namespace, Name: name}
	c.mu.Lock()
	c.scaled[k] = scaleRecord{uid: uid, d: d}
	c.mu.Unlock()
	c.loop.Add(k)
}

// lastScale is the decision Record gave for fn, or nil once the
// informer's copy shows it (or fn is another Function of the name).
func (c *Controller) lastScale(k informer.Key, fn *v1alpha1.Function) *v1alpha1.ScaleDecision {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.scaled[k]
	if !ok {
		return nil
	}
	if rec.uid != fn.UID || (fn.Status.LastScale != nil && equality.Semantic.DeepEqual(*fn.Status.LastScale, rec.d)) {
		delete(c.scaled, k)
		return nil
	}
	return &rec.d
}

// desired is fn's desired count (Desired), raised to a count Expect said
// is on its way; an expectation the informer's copy meets, of an earlier
// Function, or too old, is dropped.
func (c *Controller) desired(k informer.Key, fn *v1alpha1.Function, now time.Time) int {
	desired := Desired(fn)
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.expected[k]
	if !ok {
		return desired
	}
	hi := int(cmpOr(fn.Spec.Scale.Max, bounds.DefaultFunctionMax))
	if exp.uid != fn.UID || desired >= min(exp.replicas, hi) || now.Sub(exp.at) > expectTimeout {
		delete(c.expected, k)
		return desired
	}
	// Looked at again when it runs out, should no event come first.
	c.loop.After(exp.at.Add(expectTimeout), k)
	return min(exp.replicas, hi)
}

// replicas lists the replica Runs of the Function at k: labelled for it
// and owned by a Function (of this name; an earlier one's too). A Run
// that carries the label without such an owner is someone else's, and
// left alone.
func (c *Controller) replicas(k informer.Key) []*v1alpha1.Run {
	return c.cfg.RunInformer.List(func(run *v1alpha1.Run) bool {
		return run.Labels[v1alpha1.LabelFunction] == k.Name && informer.KeyOf(run).Namespace == k.Namespace && ownerUID(run) != ""
	})
}

// ownerUID is the UID of the Function that controls run, or "".
func ownerUID(run *v1alpha1.Run) types.UID {
	for _, o := range run.OwnerReferences {
		if o.Kind == v1alpha1.KindFunction && o.APIVersion == v1alpha1.GroupVersion.String() && o.Controller != nil && *o.Controller {
			return o.UID
		}
	}
	return ""
}

// sync decides one Function.
func (c *Controller) sync(ctx context.Context, k informer.Key) {
	fn, ok := c.cfg.FunctionInformer.Get(k.Namespace, k.Name)
	runs := c.replicas(k)
	if !ok {
		// Gone: its replicas go too (Kubernetes' garbage collector would
		// also do it; a delete of a deleted Run is NotFound, ignored).
		delete(c.fns, k)
		for _, run := range runs {
			c.deleteRun(ctx, k, run, "its Function is gone")
		}
		return
	}
	st := c.fns[k]
	if st == nil || st.uid != string(fn.UID) {
		st = &state{uid: string(fn.UID), created: map[string]time.Time{}, marked: map[types.UID]time.Time{}, dead: map[types.UID]bool{}}
		c.fns[k] = st
	}
	if err := c.reconcile(ctx, k, fn, runs, st); err != nil {
		c.log.Warn("functionset: sync failed, will try again", "function", k.String(), "error", err)
		c.loop.After(c.clk.Now().Add(errorRetry), k)
	}
}

// replicaSet is one Function's replicas sorted by what the controller does
// with them.
type replicaSet struct {
	current, old, draining []*v1alpha1.Run
	readyCurrent, readyOld int
	pending                int // created, not yet in the informer
}

func isReady(run *v1alpha1.Run) bool {
	return run.Status.Phase == v1alpha1.PhaseReady && run.DeletionTimestamp == nil
}

func isDraining(run *v1alpha1.Run) bool {
	return run.Annotations[v1alpha1.AnnotationDraining] == "true" || run.DeletionTimestamp != nil
}

func (c *Controller) reconcile(ctx context.Context, k informer.Key, fn *v1alpha1.Function, runs []*v1alpha1.Run, st *state) error {
	now := c.clk.Now()
	hash := TemplateHash(fn)
	desired := c.desired(k, fn, now)
	var set replicaSet
	var errs []error
	seen, seenUID := map[string]bool{}, map[types.UID]bool{}
	// unseenMark are the replicas marked draining whose mark the
	// informer has not delivered yet: the dispatcher, fed by the same
	// informer, may not have seen it either.
	unseenMark := map[types.UID]bool{}
	for _, run := range runs {
		seen[run.Name], seenUID[run.UID] = true, true
		if at, ok := st.marked[run.UID]; ok && !isDraining(run) && run.DeletionTimestamp == nil {
			// Marked by an earlier sync; the informer's copy is older.
			run = run.DeepCopy()
			if run.Annotations == nil {
				run.Annotations = map[string]string{}
			}
			run.Annotations[v1alpha1.AnnotationDraining] = "true"
			run.Annotations[v1alpha1.AnnotationDrainingSince] = at.UTC().Format(time.RFC3339Nano)
			unseenMark[run.UID] = true
		} else if ok {
			delete(st.marked, run.UID)
		}
		switch {
		case ownerUID(run) != fn.UID:
			// A replica of an earlier Function of the same name.
			if err := c.deleteRun(ctx, k, run, "it belongs to an earlier Function of this name"); err != nil {
				errs = append(errs, err)
			}
		case run.Status.Phase.Terminal():
			if !isDraining(run) && !st.dead[run.UID] {
				st.dead[run.UID] = true
				st.deaths++
				st.notBefore = now.Add(backoff(st.deaths))
				st.failure = fmt.Sprintf("replica %s ended %s: %s", run.Name, run.Status.Phase, bounds.Truncate(cmpOr(run.Status.Message, run.Status.Reason), 512))
				c.log.Info("functionset: a replica ended; replacing it", "function", k.String(), "run", run.Name, "run_uid", run.UID,
					"phase", run.Status.Phase, "reason", run.Status.Reason, "next_after", st.notBefore)
			}
			if err := c.deleteRun(ctx, k, run, "it ended"); err != nil {
				errs = append(errs, err)
			}
		case isDraining(run):
			set.draining = append(set.draining, run)
		case run.Labels[v1alpha1.LabelTemplateHash] == hash:
			set.current = append(set.current, run)
			if isReady(run) {
				set.readyCurrent++
			}
		default:
			set.old = append(set.old, run)
			if isReady(run) {
				set.readyOld++
			}
		}
	}
	for uid, at := range st.marked {
		if !seenUID[uid] || now.Sub(at) > expectTimeout {
			delete(st.marked, uid)
		}
	}
	for uid := range st.dead {
		if !seenUID[uid] {
			delete(st.dead, uid)
		}
	}
	for name, at := range st.created {
		if seen[name] || now.Sub(at) > expectTimeout {
			delete(st.created, name)
		}
	}
	set.pending = len(st.created)
	if set.readyCurrent > 0 {
		st.deaths, st.failure = 0, ""
	}

	// Create the current template's replicas up to the desired count.
	if need := desired - len(set.current) - set.pending; need > 0 {
		if now.Before(st.notBefore) {
			c.loop.After(st.notBefore, k)
		} else {
			for range need {
				run, err := c.create(ctx, fn, hash)
				if err != nil {
					errs = append(errs, fmt.Errorf("create a replica of function %s: %w", k, err))
					break
				}
				st.created[run.Name] = now
				if c.cfg.Created != nil {
					c.cfg.Created(run)
				}
				c.log.Info("functionset: created a replica", "function", k.String(), "run", run.Name, "run_uid", run.UID, "template_hash", hash)
			}
		}
	}

	// Take away what is too many: the old template's replicas once the
	// current template's Ready ones cover the desired count without them
	// (an old one that is not Ready serves nothing and goes at once), and
	// current ones beyond the desired count, not-Ready ones first.
	var drain []*v1alpha1.Run
	for _, run := range set.old {
		if !isReady(run) || set.readyCurrent >= desired {
			drain = append(drain, run)
		} else if set.readyCurrent+set.readyOld > desired {
			drain = append(drain, run)
			set.readyOld--
		}
	}
	if extra := len(set.current) + set.pending - desired; extra > 0 {
		cur := slices.Clone(set.current)
		slices.SortStableFunc(cur, func(a, b *v1alpha1.Run) int {
			// Not Ready first, then the newest.
			if ra, rb := isReady(a), isReady(b); ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
		})
		drain = append(drain, cur[:min(extra, len(cur))]...)
	}
	for _, run := range drain {
		marked, err := c.markDraining(ctx, k, run, now)
		if err != nil {
			errs = append(errs, err)
		}
		if marked {
			st.marked[run.UID] = now
		}
	}

	// Delete draining replicas whose time is up, or that no dispatcher
	// holds an invocation on.
	grace := time.Duration(cmpOr(fn.Spec.DrainSeconds, bounds.DefaultFunctionDrainSeconds)) * time.Second
	for _, run := range set.draining {
		if run.DeletionTimestamp != nil {
			continue
		}
		since := drainingSince(run, now)
		due := since.Add(grace)
		// The dispatcher's word counts once the mark has come through the
		// informer that feeds it too; before, it may still take the
		// replica for one that takes invocations.
		drained := c.cfg.Drained != nil && !unseenMark[run.UID] && c.cfg.Drained(k.Namespace, k.Name, string(run.UID))
		if !now.Before(due) || drained {
			if err := c.deleteRun(ctx, k, run, "drained"); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		c.loop.After(due, k)
	}
	if len(drain) > 0 {
		// The ones just marked are deleted after their grace.
		c.loop.After(now.Add(grace), k)
	}

	errs = append(errs, c.writeStatus(ctx, k, fn, hash, runs, st, now))
	if c.cfg.Load != nil {
		// The dispatcher's load changes without a store event: look
		// again (a write happens only when the numbers changed).
		c.loop.After(now.Add(LoadRefresh), k)
	}
	return errors.Join(errs...)
}

// Desired is the number of replicas fn asks for: spec.replicas, or
// scale.min when unset, within [scale.min, scale.max].
func Desired(fn *v1alpha1.Function) int {
	lo, hi := int(fn.Spec.Scale.Min), int(cmpOr(fn.Spec.Scale.Max, bounds.DefaultFunctionMax))
	want := lo
	if r := fn.Spec.Replicas; r != nil {
		want = int(*r)
	}
	return max(lo, min(want, max(hi, lo)))
}

func backoff(deaths int) time.Duration {
	if deaths <= 1 {
		return 0
	}
	d := firstBackoff << min(deaths-2, 16)
	return min(d, bounds.MaxBackoff)
}

// drainingSince reads AnnotationDrainingSince; a mark without a readable
// time counts from now.
func drainingSince(run *v1alpha1.Run, now time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, run.Annotations[v1alpha1.AnnotationDrainingSince]); err == nil {
		return t
	}
	return now
}

// markDraining writes the draining mark. It reports whether it did: on a
// conflict (the informer's copy is older) it did not, and the newer
// version the informer then delivers syncs the Function again.
func (c *Controller) markDraining(ctx context.Context, k informer.Key, run *v1alpha1.Run, now time.Time) (bool, error) {
	next := run.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[v1alpha1.AnnotationDraining] = "true"
	next.Annotations[v1alpha1.AnnotationDrainingSince] = now.UTC().Format(time.RFC3339Nano)
	if _, err := c.cfg.Runs.Update(ctx, next); err != nil {
		if gone(err) {
			return false, nil
		}
		return false, fmt.Errorf("mark replica %s of function %s draining: %w", run.Name, k, err)
	}
	c.log.Info("functionset: draining a replica", "function", k.String(), "run", run.Name, "run_uid", run.UID)
	return true, nil
}

func (c *Controller) deleteRun(ctx context.Context, k informer.Key, run *v1alpha1.Run, why string) error {
	err := c.cfg.Runs.Delete(ctx, informer.KeyOf(run).Namespace, run.Name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(run.UID)}})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("delete replica %s of function %s: %w", run.Name, k, err)
	}
	if err == nil {
		c.log.Info("functionset: deleted a replica", "function", k.String(), "run", run.Name, "run_uid", run.UID, "why", why)
	}
	return nil
}

// writeStatus writes what the controller reports, and the autoscaler's
// last decision (Record), StatusDelay after it first found it changed
// (the write then carries every change since); inFlight and queued,
// without a Load source, are another writer's, and kept.
func (c *Controller) writeStatus(ctx context.Context, k informer.Key, fn *v1alpha1.Function, hash string, runs []*v1alpha1.Run, st *state, now time.Time) error {
	next := fn.DeepCopy()
	s := &next.Status
	s.Replicas, s.ReadyReplicas, s.UpdatedReplicas = 0, 0, 0
	for _, run := range runs {
		if run.Status.Phase.Terminal() || !OwnedBy(run, string(fn.UID)) {
			continue
		}
		s.Replicas++
		if isReady(run) && !isDraining(run) {
			s.ReadyReplicas++
		}
		if run.Labels[v1alpha1.LabelTemplateHash] == hash && !isDraining(run) {
			s.UpdatedReplicas++
		}
	}
	if c.cfg.Load != nil {
		inFlight, queued := c.cfg.Load(fn.Namespace, fn.Name)
		s.InFlight, s.Queued = int32(inFlight), int32(queued)
	}
	if ls := c.lastScale(k, fn); ls != nil {
		s.LastScale = ls.DeepCopy()
	}
	s.Selector = Selector(fn.Name)
	s.TemplateHash = hash
	s.ObservedGeneration = fn.Generation
	cond := metav1.Condition{Type: ConditionReplicaFailure, Status: metav1.ConditionFalse, Reason: "ReplicasHealthy", ObservedGeneration: fn.Generation}
	if st.failure != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "ReplicaEnded", st.failure
	}
	if old := meta.FindStatusCondition(s.Conditions, cond.Type); old == nil || old.Status != cond.Status {
		cond.LastTransitionTime = metav1.NewTime(now)
	}
	meta.SetStatusCondition(&s.Conditions, cond)
	if equality.Semantic.DeepEqual(fn.Status, next.Status) {
		st.statusDue = time.Time{}
		return nil
	}
	if st.statusDue.IsZero() {
		st.statusDue = now.Add(StatusDelay)
	}
	if now.Before(st.statusDue) {
		c.loop.After(st.statusDue, k)
		return nil
	}
	if _, err := c.cfg.Functions.UpdateStatus(ctx, next); err != nil {
		if gone(err) {
			// statusDue stays past: the newer copy the informer
			// delivers is written at once.
			return nil
		}
		return fmt.Errorf("status of function %s/%s: %w", fn.Namespace, fn.Name, err)
	}
	st.statusDue = time.Time{}
	return nil
}

// gone reports an error that a later sync makes moot: the object is gone,
// or changed since the informer's copy, whose newer version the informer
// delivers and so syncs the Function again.
func gone(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict)
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// create creates one replica of fn, placed on a pod before its create
// when Config.Place finds a free slot. The name is the one GenerateName
// would give, chosen here so that the slot is reserved for it.
func (c *Controller) create(ctx context.Context, fn *v1alpha1.Function, hash string) (*v1alpha1.Run, error) {
	run := Replica(fn, hash)
	if c.cfg.Place == nil {
		return c.cfg.Runs.Create(ctx, run)
	}
	run.Name = generatedName(run.GenerateName)
	pod, placed := c.cfg.Place(ctx, run.Namespace, run.Name, run.Spec.Runtime)
	if placed {
		placement.Place(run, pod)
	}
	created, err := c.cfg.Runs.Create(ctx, run)
	if err != nil && placed {
		c.cfg.Unplace(run.Namespace, run.Name)
	}
	return created, err
}

// generatedName is the name the API server gives an object created with
// GenerateName base (its SimpleNameGenerator): base, cut to 58
// characters, and five random ones.
func generatedName(base string) string {
	const maxBase = 63 - 5
	if len(base) > maxBase {
		base = base[:maxBase]
	}
	return base + utilrand.String(5)
}
