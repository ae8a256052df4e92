package agent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are an Endpoint's Prometheus metrics.
type Metrics struct {
	connected prometheus.Gauge
	redials   prometheus.Counter
	refused   prometheus.Counter
	busy      prometheus.Counter
	sessions  prometheus.Counter
	open      prometheus.Gauge
	bytes     *prometheus.CounterVec
	in, out   prometheus.Counter
	// disconnects by how: ended (the agent said goodbye: its invocation
	// is over) or dropped (the connection was lost; it may redial).
	disconnects *prometheus.CounterVec
}

// NewMetrics returns unregistered metrics; Collectors lists them.
func NewMetrics() *Metrics {
	m := &Metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stoke_agent_connected",
			Help: "Reverse agents connected to this Runtime Server now."}),
		redials: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_agent_redials_total",
			Help: "Connections of an agent that had been connected before (a redial after a drop)."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_agent_refused_total",
			Help: "Agent connections refused with 401 (unknown, wrong, expired or already used secret)."}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_agent_busy_total",
			Help: "Agent connections answered 409: the grant's previous connection had not ended here yet (the agent redials)."}),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_agent_sessions_total",
			Help: "Exec sessions started through a reverse agent."}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stoke_agent_sessions_open",
			Help: "Exec sessions open through a reverse agent now."}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_agent_bytes_total",
			Help: "Bytes on agent connections (WebSocket payload), by direction: in from the agents, out to them."}, []string{"direction"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_agent_disconnects_total",
			Help: "Agent connections that ended, by how: ended (the agent's invocation ended it) or dropped (lost; the agent redials)."}, []string{"how"}),
	}
	m.in, m.out = m.bytes.WithLabelValues("in"), m.bytes.WithLabelValues("out")
	return m
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.connected, m.redials, m.refused, m.busy, m.sessions, m.open, m.bytes, m.disconnects}
}

func (m *Metrics) count(in, out int) {
	if in > 0 {
		m.in.Add(float64(in))
	}
	if out > 0 {
		m.out.Add(float64(out))
	}
}
