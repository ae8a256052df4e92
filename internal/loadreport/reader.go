package loadreport

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/internal/logging"
)

// ReaderConfig configures a Reader.
type ReaderConfig struct {
	// Client lists and watches the records.
	Client kubernetes.Interface
	// Namespace is the gateways' (the controller's own).
	Namespace string
	// OnChange, when set, is called with each Function whose entry in a
	// record changed (the autoscaler's Poke); it must not block.
	OnChange func(namespace, name string)
	// Clock judges freshness; it defaults to the real clock.
	Clock clock.PassiveClock
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
}

// Reader sums the gateways' records. Create it with NewReader; Run
// follows the records until its context ends.
type Reader struct {
	cfg ReaderConfig
	log *slog.Logger
	clk clock.PassiveClock
	inf cache.SharedIndexInformer

	mu      sync.Mutex
	records map[string]*record // by Lease name
}

type record struct {
	rep      Report
	renew    string // renewTime as written
	seen     time.Time
	duration time.Duration
}

// NewReader checks cfg and returns a Reader.
func NewReader(cfg ReaderConfig) (*Reader, error) {
	if cfg.Client == nil || cfg.Namespace == "" {
		return nil, errors.New("loadreport: a client and the gateways' namespace are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	r := &Reader{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, records: map[string]*record{}}
	r.inf = coordinationinformers.NewFilteredLeaseInformer(cfg.Client, cfg.Namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" })
	if _, err := r.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.set(obj) },
		UpdateFunc: func(_, obj any) { r.set(obj) },
		DeleteFunc: r.remove,
	}); err != nil {
		return nil, err
	}
	return r, nil
}

// Run follows the records until ctx ends; it returns nil.
func (r *Reader) Run(ctx context.Context) error {
	r.inf.RunWithContext(ctx)
	return nil
}

// HasSynced says whether the records have been listed.
func (r *Reader) HasSynced() bool { return r.inf.HasSynced() }

// Load is a Function's in-flight and queued invocations over every fresh
// record: the autoscaler's LoadFunc.
func (r *Reader) Load(namespace, name string) (inFlight, queued int) {
	k := Key(namespace, name)
	now := r.clk.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if now.Sub(rec.seen) >= rec.duration {
			continue
		}
		l := rec.rep[k]
		inFlight += l.InFlight
		queued += l.Queued
	}
	return inFlight, queued
}

func (r *Reader) set(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	rep, err := decode(l.Annotations[Annotation])
	if err != nil {
		r.log.Warn("controller: a gateway's load record is unreadable; it counts as no load", "lease", l.Namespace+"/"+l.Name, "error", err)
		rep = Report{}
	}
	rec := &record{rep: rep, seen: r.clk.Now(), duration: LeaseDuration}
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		rec.duration = time.Duration(*d) * time.Second
	}
	if t := l.Spec.RenewTime; t != nil {
		rec.renew = t.UTC().Format(time.RFC3339Nano)
	}
	r.mu.Lock()
	old := r.records[l.Name]
	if old != nil && old.renew == rec.renew && rec.renew != "" {
		rec.seen = old.seen // not rewritten by its gateway (a resync)
	}
	r.records[l.Name] = rec
	r.mu.Unlock()
	var before Report
	if old != nil {
		before = old.rep
	}
	r.changed(before, rep)
}

func (r *Reader) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	r.mu.Lock()
	old := r.records[l.Name]
	delete(r.records, l.Name)
	r.mu.Unlock()
	if old != nil {
		r.changed(old.rep, nil)
	}
}

// changed tells OnChange of every Function whose entry differs.
func (r *Reader) changed(before, after Report) {
	if r.cfg.OnChange == nil {
		return
	}
	for k, l := range after {
		if before[k] != l {
			r.poke(k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			r.poke(k)
		}
	}
}

func (r *Reader) poke(k string) {
	if ns, name, ok := strings.Cut(k, "/"); ok {
		r.cfg.OnChange(ns, name)
	}
}
