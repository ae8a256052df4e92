package controlplane

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/scheduler"
)

// Metrics are the scheduler's Prometheus metrics, in both modes: the time
// to schedule, the queue depth, the Unschedulable conditions written and
// the reservation conflicts. No label carries a Run, Runtime or pod name,
// so the series are a fixed few whatever the load. stoke up serves them
// on its /metrics, stoke controller on its own (registered once per
// process; the leading replica's scheduler is the one counted).
type Metrics struct {
	latency       prometheus.Histogram
	unschedulable prometheus.Counter
	conflicts     prometheus.Counter
	waitingDesc   *prometheus.Desc

	mu    sync.Mutex
	sched *scheduler.Scheduler // the running one, for the queue depth
}

// NewMetrics builds the scheduler's metrics; register them (a Metrics is a
// prometheus.Collector) and pass them in Config.Metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stoke_scheduling_duration_seconds",
			Help:    "Time from a Run attempt waiting to its stored assignment to a pod.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12), // 0.5 ms … 12 s
		}),
		unschedulable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stoke_scheduler_unschedulable_total",
			Help: "Scheduled=False/Unschedulable conditions the scheduler wrote (a Run waited while its Runtime's pool handed out no slot).",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stoke_scheduler_conflicts_total",
			Help: "Assignments the store refused because the Run had changed meanwhile (the Run is decided again from its newer version).",
		}),
		waitingDesc: prometheus.NewDesc("stoke_scheduler_waiting_runs",
			"Runs waiting for a free slot now (the scheduler's queue depth, all Runtimes together).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.latency.Describe(ch)
	m.unschedulable.Describe(ch)
	m.conflicts.Describe(ch)
	ch <- m.waitingDesc
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.latency.Collect(ch)
	m.unschedulable.Collect(ch)
	m.conflicts.Collect(ch)
	m.mu.Lock()
	s := m.sched
	m.mu.Unlock()
	waiting := 0
	if s != nil {
		waiting = s.Waiting()
	}
	ch <- prometheus.MustNewConstMetric(m.waitingDesc, prometheus.GaugeValue, float64(waiting))
}

// hooks sets cfg's metrics hooks, keeping an OnScheduled already set.
func (m *Metrics) hooks(cfg *scheduler.Config) {
	if m == nil {
		return
	}
	then := cfg.OnScheduled
	cfg.OnScheduled = func(run *v1alpha1.Run, latency time.Duration) {
		m.latency.Observe(latency.Seconds())
		if then != nil {
			then(run, latency)
		}
	}
	cfg.OnUnschedulable = func(*v1alpha1.Run) { m.unschedulable.Inc() }
	cfg.OnConflict = func(*v1alpha1.Run) { m.conflicts.Inc() }
}

// running makes s the scheduler whose queue is counted until the returned
// function is called.
func (m *Metrics) running(s *scheduler.Scheduler) func() {
	if m == nil {
		return func() {}
	}
	m.mu.Lock()
	m.sched = s
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.sched == s {
			m.sched = nil
		}
		m.mu.Unlock()
	}
}
