package runtimed

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtime/server"
)

// Metrics are one runtimed's Prometheus metrics: its Runs by phase, the
// dispatch latency (from runtimed taking a Run to the Runtime Server
// accepting its execution or registration) and the invocations through
// its hop by result. Every label is one of a fixed few values (phases,
// modes, results), never a Run or an invocation. In Kubernetes mode they
// are served on the metrics.v1 service of the hop (mutual TLS; only the
// gateway's certificate gets in), and the gateway serves them on its
// authenticated /metrics, labelled with their pod.
type Metrics struct {
	reg         *prometheus.Registry
	dispatch    *prometheus.HistogramVec
	invocations *prometheus.CounterVec
	invokeTime  *prometheus.HistogramVec
}

// Modes of the dispatch latency's label.
const (
	modeTask     = "task"
	modeFunction = "function"
)

// NewMetrics builds the registry; phases, when set, lists the Runs
// runtimed holds at each scrape (its informer's).
func NewMetrics(phases func() []v1alpha1.Phase) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.dispatch = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stoke_runtimed_dispatch_duration_seconds",
		Help:    "Time from runtimed taking a Run assigned to its pod to the Runtime Server accepting its execution (task) or registration (function), by mode.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12), // 0.5 ms … 12 s
	}, []string{"mode"})
	m.invocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stoke_runtimed_invocations_total",
		Help: "Function invocations through runtimed's hop, by result: ok, function_error or the gRPC code in snake case.",
	}, []string{"result"})
	m.invokeTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stoke_runtimed_invocation_duration_seconds",
		Help:    "Time from an invocation's arrival at runtimed's hop to its answer, by result.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100 µs … 15 s
	}, []string{"result"})
	m.reg.MustRegister(m.dispatch, m.invocations, m.invokeTime)
	if phases != nil {
		m.reg.MustRegister(&phaseCollector{list: phases, desc: prometheus.NewDesc("stoke_runtimed_runs",
			"Runs assigned to this runtimed's pod, by phase.", []string{"phase"}, nil)})
	}
	return m
}

// Gatherer is what the metrics.v1 service serves.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// dispatched records one Run's dispatch latency (nil-safe).
func (m *Metrics) dispatched(mode string, d time.Duration) {
	if m != nil {
		m.dispatch.WithLabelValues(mode).Observe(d.Seconds())
	}
}

// Unary observes InvokeFunction calls through the hop. It is the hop's
// innermost interceptor, so it sees the error categories before their
// translation to status codes.
func (m *Metrics) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != pb.FunctionRuntime_InvokeFunction_FullMethodName {
			return handler(ctx, req)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		result := server.InvokeResult(err)
		m.invocations.WithLabelValues(result).Inc()
		m.invokeTime.WithLabelValues(result).Observe(time.Since(start).Seconds())
		return resp, err
	}
}

// phaseCollector counts the Runs by phase at scrape time, so nothing is
// counted on the status write path.
type phaseCollector struct {
	list func() []v1alpha1.Phase
	desc *prometheus.Desc
}

// phases are every phase a Run can have; "" (not yet scheduled) never
// reaches runtimed.
var phases = []v1alpha1.Phase{
	v1alpha1.PhasePending, v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseReady,
	v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed, v1alpha1.PhaseTimeout, v1alpha1.PhaseCancelled,
}

func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *phaseCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[v1alpha1.Phase]int{}
	for _, p := range c.list() {
		counts[p]++
	}
	for _, p := range phases {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[p]), string(p))
	}
}
