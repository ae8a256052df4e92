package loadreport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/internal/logging"
)

// The writer's cadence.
const (
	// DefaultPeriod is how often a writer looks for a change of its loads.
	DefaultPeriod = time.Second
	// DefaultUrgentInterval is the least time between two writes made
	// because an invocation queued for a Function with no replica (Poke);
	// the period's writes do not count (at most one per Period).
	DefaultUrgentInterval = 50 * time.Millisecond
	// DefaultRefresh is how often a record that shows load is rewritten
	// unchanged, so that it stays fresh (LeaseDuration).
	DefaultRefresh = 10 * time.Second
	// callTimeout bounds one write.
	callTimeout = 5 * time.Second
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Leases is the gateway's namespace's Leases.
	Leases coordinationclient.LeaseInterface
	// Pod is the gateway's Pod: the record is NamePrefix+Pod, held by
	// Pod, and owned by it when PodUID is set (so that it goes with it).
	Pod    string
	PodUID types.UID
	// Loads is the gateway's loads now (only Functions with load).
	Loads func() Report
	// Period, UrgentInterval and Refresh default to DefaultPeriod,
	// DefaultUrgentInterval and DefaultRefresh.
	Period, UrgentInterval, Refresh time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
}

// Writer keeps one gateway's load record. Create it with NewWriter; Run
// writes until its context ends.
type Writer struct {
	cfg  WriterConfig
	log  *slog.Logger
	clk  clock.WithTicker
	poke chan struct{}

	// Owned by Run.
	cur       *coordinationv1.Lease // as last written, nil: read it first
	last      Report
	lastWrite time.Time
	// lastUrgent is when a poke's write was last made: UrgentInterval
	// bounds those among themselves, so that a poke is not held back by
	// the period's write just before it.
	lastUrgent time.Time
	failing    bool
}

// NewWriter checks cfg and returns a Writer.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Leases == nil || cfg.Pod == "" || cfg.Loads == nil {
		return nil, errors.New("loadreport: the Leases, the Pod's name and the loads are required")
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.UrgentInterval <= 0 {
		cfg.UrgentInterval = DefaultUrgentInterval
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	return &Writer{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, poke: make(chan struct{}, 1)}, nil
}

// Name is the record's name.
func (w *Writer) Name() string { return NamePrefix + w.cfg.Pod }

// Poke asks for the loads to be written soon (at once, or UrgentInterval
// after the last poke's write): the gateway calls it when an invocation
// queues for a Function that has no replica taking invocations, so that
// the autoscaler scales it from zero at once. It never blocks.
func (w *Writer) Poke() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Run writes the record (at once, then as the package comment says)
// until ctx ends, then deletes it and returns nil.
func (w *Writer) Run(ctx context.Context) error {
	w.write(ctx, true)
	tick := w.clk.NewTicker(w.cfg.Period)
	defer tick.Stop()
	var urgent clock.Timer
	var urgentC <-chan time.Time
	defer func() {
		if urgent != nil {
			urgent.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			w.remove()
			return nil
		case <-tick.C():
			w.write(ctx, false)
		case <-w.poke:
			if urgentC != nil {
				break
			}
			if wait := w.lastUrgent.Add(w.cfg.UrgentInterval).Sub(w.clk.Now()); wait > 0 {
				urgent = w.clk.NewTimer(wait)
				urgentC = urgent.C()
			} else {
				w.writeUrgent(ctx)
			}
		case <-urgentC:
			urgentC = nil
			w.writeUrgent(ctx)
		}
	}
}

// writeUrgent is a poke's write.
func (w *Writer) writeUrgent(ctx context.Context) {
	w.lastUrgent = w.clk.Now()
	w.write(ctx, false)
}

// write puts the loads in the record when they changed (or always, or
// when a record with load is due for its refresh).
func (w *Writer) write(ctx context.Context, always bool) {
	rep := w.cfg.Loads()
	now := w.clk.Now()
	if !always && w.cur != nil && maps.Equal(rep, w.last) && (len(rep) == 0 || now.Sub(w.lastWrite) < w.cfg.Refresh) {
		return
	}
	if err := w.put(ctx, rep, now); err != nil {
		w.cur = nil // read it again next time
		if ctx.Err() == nil && !w.failing {
			w.log.Warn("gateway: cannot write the function load record; the autoscaler does not see this gateway's load until it can", "lease", w.Name(), "error", err)
		}
		w.failing = true
		return
	}
	if w.failing {
		w.log.Info("gateway: the function load record is written again", "lease", w.Name())
	}
	w.failing, w.last, w.lastWrite = false, rep, now
}

// put writes rep to the record, creating it when there is none.
func (w *Writer) put(ctx context.Context, rep Report, now time.Time) error {
	val, err := rep.encode()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if w.cur == nil {
		cur, err := w.cfg.Leases.Get(ctx, w.Name(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := w.cfg.Leases.Create(ctx, w.record(&coordinationv1.Lease{}, val, now), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create lease %s: %w", w.Name(), err)
			}
			w.cur = created
			return nil
		case err != nil:
			return fmt.Errorf("read lease %s: %w", w.Name(), err)
		}
		w.cur = cur
	}
	updated, err := w.cfg.Leases.Update(ctx, w.record(w.cur.DeepCopy(), val, now), metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update lease %s: %w", w.Name(), err)
	}
	w.cur = updated
	return nil
}

// record is l with the record's name, marks and loads val.
func (w *Writer) record(l *coordinationv1.Lease, val string, now time.Time) *coordinationv1.Lease {
	l.Name = w.Name()
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[Label] = "true"
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[Annotation] = val
	if w.cfg.PodUID != "" && len(l.OwnerReferences) == 0 {
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: w.cfg.Pod, UID: w.cfg.PodUID}}
	}
	holder, secs := w.cfg.Pod, int32(LeaseDuration/time.Second)
	renew := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &holder, &secs, &renew
	return l
}

// remove deletes the record as the gateway stops, so that its load is
// not counted until the record would expire.
func (w *Writer) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err := w.cfg.Leases.Delete(ctx, w.Name(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		w.log.Warn("gateway: cannot delete the function load record; it counts until it expires", "lease", w.Name(), "error", err)
	}
}
