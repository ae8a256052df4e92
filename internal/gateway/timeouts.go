package gateway

import (
	"net/http"
	"time"
)

// Timeouts bound how long a client may take, so that a slow or stalled
// client holds a connection for a bounded time only. A response that
// lives longer than Write sets its own write deadlines through
// http.ResponseController: a stream before each write (nextWrite), an
// invocation from its own timeout. (net/http lifts the read deadline
// itself once a request has been read, and both deadlines from a hijacked
// connection, such as exec's WebSocket.)
type Timeouts struct {
	// ReadHeader bounds reading a request's headers (slowloris).
	ReadHeader time.Duration
	// Read bounds reading a whole request, its body included.
	Read time.Duration
	// Write bounds writing a response; a stream (watch, followed log)
	// instead gets this long for each of its writes.
	Write time.Duration
	// Idle bounds how long a kept-alive connection waits for its next
	// request.
	Idle time.Duration
}

// DefaultTimeouts are the API server's timeouts.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Write: time.Minute, Idle: 2 * time.Minute}
}

// withDefaults fills the zero fields from DefaultTimeouts.
func (t Timeouts) withDefaults() Timeouts {
	d := DefaultTimeouts()
	for _, f := range []struct{ v, def *time.Duration }{{&t.ReadHeader, &d.ReadHeader}, {&t.Read, &d.Read}, {&t.Write, &d.Write}, {&t.Idle, &d.Idle}} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// Server returns an HTTP server of the gateway with its timeouts.
func (g *Gateway) Server() *http.Server {
	t := g.cfg.Timeouts
	srv := &http.Server{Handler: g, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle}
	srv.RegisterOnShutdown(g.failed.Close) // its flush timer ends with the server
	return srv
}

// nextWrite gives a stream's next write the server's write timeout.
func (g *Gateway) nextWrite(rc *http.ResponseController) {
	_ = rc.SetWriteDeadline(time.Now().Add(g.cfg.Timeouts.Write))
}
