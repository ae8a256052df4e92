package gateway

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/logsummary"
)

// Metrics is the Prometheus registry of a standalone Stoke: invocations by
// status code and their latency, API requests, Runs by phase, plus the Go
// and process collectors (stoke up registers the scheduler's,
// controlplane.Metrics, here too).
type Metrics struct {
	reg           *prometheus.Registry
	included      prometheus.Gatherers // more families served on /metrics
	invocations   *prometheus.CounterVec
	invokeLatency *prometheus.HistogramVec
	apiRequests   *prometheus.CounterVec
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	exec          execMetrics

	// invokeOK holds the series of an invocation answered 200, resolved
	// at the first (the series appears with it, as before): no label
	// lookup for the usual answer.
	invokeOKOnce sync.Once
	invokeOK     okSeries
}

// okSeries are the series of an invocation answered 200, and of the
// invoke route's request answered 200.
type okSeries struct {
	count, request        prometheus.Counter
	latency, routeLatency prometheus.Observer
}

// NewMetrics builds the registry; runPhases, when set, counts the Runs by
// phase at each scrape.
func NewMetrics(runPhases func() map[v1alpha1.Phase]int) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.invocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stoke_invocations_total",
		Help: "Function invocations through the gateway, by HTTP status code.",
	}, []string{"code"})
	m.invokeLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stoke_invocation_duration_seconds",
		Help:    "Latency of function invocations at the gateway, by HTTP status code.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100 µs … 15 s
	}, []string{"code"})
	m.apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stoke_api_requests_total",
		Help: "HTTP API requests other than invocations, by method and status code.",
	}, []string{"method", "code"})
	// Every route's requests, refusals included: the route is one of a
	// fixed few names, the code one of the statuses the gateway writes.
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stoke_gateway_requests_total",
		Help: "Requests the gateway answered, by route (invoke, exec, logs, metrics, objects) and HTTP status code (101: an exec upgraded).",
	}, []string{"route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stoke_gateway_request_duration_seconds",
		Help:    "Time from a request's routing to its answer's end (an exec or a followed log: the whole session), by route.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100 µs … 15 s
	}, []string{"route"})
	m.reg.MustRegister(m.invocations, m.invokeLatency, m.apiRequests, m.requests, m.latency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if runPhases != nil {
		m.reg.MustRegister(&phaseCollector{count: runPhases, desc: prometheus.NewDesc("stoke_runs",
			"Runs by phase, as the control plane's memory holds them.", []string{"phase"}, nil)})
	}
	m.exec = newExecMetrics(m.reg)
	return m
}

func (m *Metrics) observeInvoke(status int, d time.Duration) {
	if m == nil {
		return
	}
	if status == http.StatusOK {
		ok := m.okInvoke()
		ok.count.Inc()
		ok.latency.Observe(d.Seconds())
		return
	}
	code := strconv.Itoa(status)
	m.invocations.WithLabelValues(code).Inc()
	m.invokeLatency.WithLabelValues(code).Observe(d.Seconds())
}

// okInvoke resolves the okSeries at the first call.
func (m *Metrics) okInvoke() *okSeries {
	m.invokeOKOnce.Do(func() {
		code := strconv.Itoa(http.StatusOK)
		m.invokeOK.count, m.invokeOK.latency = m.invocations.WithLabelValues(code), m.invokeLatency.WithLabelValues(code)
		m.invokeOK.request, m.invokeOK.routeLatency = m.requests.WithLabelValues(invokeRoute, code), m.latency.WithLabelValues(invokeRoute)
	})
	return &m.invokeOK
}

func (m *Metrics) observeRequest(route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if status == 0 {
		status = http.StatusSwitchingProtocols // hijacked: an exec's WebSocket
	}
	if route == invokeRoute && status == http.StatusOK {
		ok := m.okInvoke()
		ok.request.Inc()
		ok.routeLatency.Observe(d.Seconds())
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

// MustRegister adds collectors of the gateway's composition (the
// Kubernetes gateway's authorization cache) to the registry.
func (m *Metrics) MustRegister(cs ...prometheus.Collector) { m.reg.MustRegister(cs...) }

// countSummarised serves how many failed invocations the log summed up
// rather than logged one by one.
func (m *Metrics) countSummarised(s *logsummary.Summariser) {
	if m == nil {
		return
	}
	// A second gateway on the same registry keeps the first's.
	_ = m.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "stoke_invocation_log_lines_summarised_total",
		Help: "Failed invocations counted into a per-function summary line of the server log rather than logged on their own (stoke_invocations_total counts them all by code).",
	}, func() float64 { return float64(s.Summarised()) }))
}

func (m *Metrics) observeAPI(method string, status int) {
	if m == nil {
		return
	}
	m.apiRequests.WithLabelValues(method, strconv.Itoa(status)).Inc()
}

// Include serves g's families on /metrics too: stoke up includes its
// pods' Runtime Server metrics. Call it before New.
func (m *Metrics) Include(g prometheus.Gatherer) {
	m.included = append(m.included, g)
}

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(append(prometheus.Gatherers{m.reg}, m.included...), promhttp.HandlerOpts{})
}

// phaseCollector reports Runs by phase at scrape time, so nothing is
// counted on the Run write path.
type phaseCollector struct {
	count func() map[v1alpha1.Phase]int
	desc  *prometheus.Desc
}

var allPhases = []v1alpha1.Phase{
	v1alpha1.PhasePending, v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseReady,
	v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed, v1alpha1.PhaseTimeout, v1alpha1.PhaseCancelled,
}

func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *phaseCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.count()
	for _, p := range allPhases {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[p]), string(p))
	}
}
