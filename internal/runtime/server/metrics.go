package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"stoke.dev/stoke/internal/errdefs"
)

// Metrics are a Runtime Server's Prometheus metrics: function invocations
// by result with their duration, the invocations in flight and the
// registrations by state. They are served on the metrics.v1 gRPC service
// of the server's own socket (internal/metricsrpc), which stoke up
// scrapes; no HTTP port is opened for them.
type Metrics struct {
	reg         *prometheus.Registry
	invocations *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    prometheus.Gauge
	// okCount and okDuration are the series of result "ok", resolved at
	// the first (so that, as before, the series appears with it).
	okOnce     sync.Once
	okCount    prometheus.Counter
	okDuration prometheus.Observer
}

// NewMetrics builds the registry; registrations counts the registrations
// by state at each scrape (runtime.Functions.RegistrationStates), and may
// be nil for a server without functions.
func NewMetrics(registrations func() map[string]int) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.invocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stoke_runtime_invocations_total",
		Help: "Function invocations this Runtime Server answered, by result: ok, function_error or the gRPC code in snake case.",
	}, []string{"result"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stoke_runtime_invocation_duration_seconds",
		Help:    "Time from an InvokeFunction call's arrival to its answer, by result.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100 µs … 15 s
	}, []string{"result"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "stoke_runtime_invocations_in_flight",
		Help: "Function invocations this Runtime Server is answering now.",
	})
	m.reg.MustRegister(m.invocations, m.duration, m.inFlight)
	if registrations != nil {
		m.reg.MustRegister(&stateCollector{count: registrations, desc: prometheus.NewDesc(
			"stoke_runtime_registrations", "Function registrations on this Runtime Server, by state.", []string{"state"}, nil)})
	}
	return m
}

// Registry is where further metrics of the server are registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// observeInvoke runs an InvokeFunction call (handler) that arrived at
// start and observes it. It is the innermost step of unaryInterceptor, so
// it sees the error categories before their translation to status codes.
func (m *Metrics) observeInvoke(ctx context.Context, req any, handler grpc.UnaryHandler, start time.Time) (any, error) {
	m.inFlight.Inc()
	defer m.inFlight.Dec()
	resp, err := handler(ctx, req)
	var count prometheus.Counter
	var duration prometheus.Observer
	if err == nil {
		// Resolved once: no label lookup for the usual answer.
		m.okOnce.Do(func() {
			m.okCount, m.okDuration = m.invocations.WithLabelValues("ok"), m.duration.WithLabelValues("ok")
		})
		count, duration = m.okCount, m.okDuration
	} else {
		result := InvokeResult(err)
		count, duration = m.invocations.WithLabelValues(result), m.duration.WithLabelValues(result)
	}
	count.Inc()
	duration.Observe(time.Since(start).Seconds())
	return resp, err
}

// InvokeResult is the result label of an invocation that returned err
// (runtimed labels the hop's invocations with it too).
func InvokeResult(err error) string {
	if err == nil {
		return "ok"
	}
	var fe *errdefs.FunctionError
	if errors.As(err, &fe) {
		return "function_error"
	}
	return snakeCase(errdefs.Code(err).String())
}

// snakeCase turns a gRPC code name ("DeadlineExceeded") into a label value
// ("deadline_exceeded").
func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// stateCollector reports counts by state at scrape time, so nothing is
// counted on the registration path.
type stateCollector struct {
	count func() map[string]int
	desc  *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for state, n := range c.count() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), state)
	}
}
