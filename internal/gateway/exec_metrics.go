package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"stoke.dev/stoke/internal/exec/channel"
)

// execMetrics are the exec sessions' metrics.
type execMetrics struct {
	open    prometheus.Gauge
	started *prometheus.CounterVec
	bytes   *prometheus.CounterVec
}

func newExecMetrics(reg *prometheus.Registry) execMetrics {
	m := execMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stoke_exec_sessions_open",
			Help: "Exec sessions open through the gateway.",
		}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stoke_exec_sessions_started_total",
			Help: "Exec session requests, by HTTP status: 101 when the session started, the error's status otherwise.",
		}, []string{"code"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stoke_exec_bytes_total",
			Help: "Exec payload bytes: in is stdin to the command, out its stdout and stderr.",
		}, []string{"direction"}),
	}
	reg.MustRegister(m.open, m.started, m.bytes)
	return m
}

func (m *Metrics) observeExecStart(status int) {
	if m == nil {
		return
	}
	m.exec.started.WithLabelValues(strconv.Itoa(status)).Inc()
}

// execOpened counts an open session until the returned function is called.
func (m *Metrics) execOpened() func() {
	if m == nil {
		return func() {}
	}
	m.exec.open.Inc()
	return m.exec.open.Dec
}

func (m *Metrics) execCounters() channel.Counters {
	if m == nil {
		return channel.Counters{}
	}
	in, out := m.exec.bytes.WithLabelValues("in"), m.exec.bytes.WithLabelValues("out")
	return channel.Counters{In: func(n int) { in.Add(float64(n)) }, Out: func(n int) { out.Add(float64(n)) }}
}
