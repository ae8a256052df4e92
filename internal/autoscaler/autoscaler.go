package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/store"
)

// Defaults.
const (
	// DefaultWindow is how far back the load's peak is taken.
	DefaultWindow = 5 * time.Second
	// DefaultSamplePeriod is how often a Function with load or replicas
	// above its minimum is sampled.
	DefaultSamplePeriod = time.Second
	// DefaultWorkers is the number of concurrent writes.
	DefaultWorkers = 2
	// errorBackoff is how long a Function whose write failed waits before
	// it is decided again.
	errorBackoff = time.Second
	// maxSamples bounds one Function's samples (a window of a minute at
	// 20 samples a second; older ones go first).
	maxSamples = 1200
)

// LoadFunc returns a Function's in-flight and queued invocations now.
type LoadFunc func(namespace, name string) (inFlight, queued int)

// Config configures an Autoscaler.
type Config struct {
	// Functions is where spec.replicas is written.
	Functions store.Resource[*v1alpha1.Function]
	// Record hears of each scale once its spec.replicas write returned
	// (the Function controller's Record: it writes status.lastScale with
	// its next status write). Required.
	Record func(namespace, name string, uid types.UID, d v1alpha1.ScaleDecision)
	// FunctionInformer is the shared Functions informer; the caller runs
	// it.
	FunctionInformer *informer.Informer[*v1alpha1.Function]
	// Load, when set, is the load source (the dispatcher); nil reads the
	// Function's status.inFlight and status.queued.
	Load LoadFunc
	// Expect, when set, hears of each scale up as its write starts (the
	// Function controller's Expect: it makes the replicas without waiting
	// for the write to come back through the informer), and of its
	// withdrawal (replicas 0) when the write failed.
	Expect func(namespace, name string, uid types.UID, replicas int)
	// Window defaults to DefaultWindow, SamplePeriod to
	// DefaultSamplePeriod, Workers to DefaultWorkers.
	Window       time.Duration
	SamplePeriod time.Duration
	Workers      int
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
}

// Autoscaler sets Functions' desired replicas. Create it with New; Run
// drives it.
type Autoscaler struct {
	cfg     Config
	log     *slog.Logger
	clk     clock.Clock
	loop    *loop.Loop[informer.Key, struct{}, result]
	started atomic.Bool

	// Owned by the loop goroutine.
	fns map[informer.Key]*fnState
}

// fnState is what the autoscaler remembers of one Function.
type fnState struct {
	uid     string
	samples []sample
	// lowSince is when the wanted count first fell below the current one
	// without a break since (zero: it has not); lowPeak is the largest
	// count wanted since.
	lowSince time.Time
	lowPeak  int
	// busy: a write is in flight. holdRV: do not decide while the
	// informer still shows this version (the write is on its way).
	busy    bool
	expects bool // the write in flight is a scale up Config.Expect heard of
	holdRV  string
	retryAt time.Time
}

type sample struct {
	at   time.Time
	load int
}

// result is a finished write; scaled: spec.replicas was written.
type result struct {
	key    informer.Key
	scaled bool
	err    error
}

// New checks cfg and returns an Autoscaler.
func New(cfg Config) (*Autoscaler, error) {
	switch {
	case cfg.Functions == nil:
		return nil, errors.New("autoscaler: Config.Functions is required")
	case cfg.FunctionInformer == nil:
		return nil, errors.New("autoscaler: Config.FunctionInformer is required")
	case cfg.Record == nil:
		return nil, errors.New("autoscaler: Config.Record is required")
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.SamplePeriod <= 0 {
		cfg.SamplePeriod = DefaultSamplePeriod
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	a := &Autoscaler{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, fns: map[informer.Key]*fnState{}}
	a.loop = loop.New(loop.Config[informer.Key, struct{}, result]{
		Clock:   cfg.Clock,
		Workers: cfg.Workers,
		Hooks:   loop.Hooks[informer.Key, struct{}, result]{Sync: a.sync, Result: a.handleResult},
	})
	return a, nil
}

// Poke asks for a Function to be sampled now: the dispatcher calls it when
// an invocation queues, so that an idle Function scales from zero without
// waiting for a sample. It never blocks and may be called from any
// goroutine.
func (a *Autoscaler) Poke(namespace, name string) {
	if namespace == "" {
		namespace = store.DefaultNamespace
	}
	a.loop.Add(informer.Key{Namespace: namespace, Name: name})
}

// Run waits for the informer to sync and scales until ctx ends; then it
// waits for its writes to finish and returns nil. Run may be called once.
func (a *Autoscaler) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("autoscaler: Run called twice")
	}
	if err := a.cfg.FunctionInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	add := func(fn *v1alpha1.Function) { a.loop.Add(informer.KeyOf(fn)) }
	remove := a.cfg.FunctionInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Function]{
		AddFunc:    add,
		UpdateFunc: func(_, fn *v1alpha1.Function) { add(fn) },
		DeleteFunc: add,
	})
	defer remove()
	if err := a.loop.Run(ctx, nil); err != nil {
		return fmt.Errorf("autoscaler: %w", err)
	}
	return nil
}

// bounds of fn's scale, with the defaults for what it leaves at zero.
func scaleOf(fn *v1alpha1.Function) (lo, hi, target int) {
	sc := fn.Spec.Scale
	lo, hi, target = int(sc.Min), int(sc.Max), int(sc.TargetInFlight)
	if hi <= 0 {
		hi = bounds.DefaultFunctionMax
	}
	if target <= 0 {
		target = bounds.DefaultFunctionTargetInFlight
	}
	return lo, max(hi, lo), target
}

func idleOf(fn *v1alpha1.Function) time.Duration {
	s := fn.Spec.Scale.IdleSeconds
	if s <= 0 {
		s = bounds.DefaultFunctionIdleSeconds
	}
	return time.Duration(s) * time.Second
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// load reads fn's in-flight and queued invocations.
func (a *Autoscaler) load(fn *v1alpha1.Function) (inFlight, queued int) {
	if a.cfg.Load != nil {
		inFlight, queued = a.cfg.Load(fn.Namespace, fn.Name)
	} else {
		inFlight, queued = int(fn.Status.InFlight), int(fn.Status.Queued)
	}
	return max(inFlight, 0), max(queued, 0)
}
