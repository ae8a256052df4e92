// Package agent is exec's reverse agent: a way to exec into a Run that runs
// where nothing can dial in (a Lambda sandbox). The agent, inside the
// sandbox, dials out to its Runtime Server's Endpoint over one WebSocket
// (TLS, or plaintext to a loopback address only), authenticated by a
// secret the Runtime Server minted for that one invocation, and serves
// gRPC over it: executor.v1.Exec, so that a session into the sandbox is the
// same stream as into a local Run (HTTP/2's per-stream flow control, many
// sessions on one connection, every frame bounded, nothing dropped or
// reordered), and agent.v1.AgentService, for the deadline notice, a task's
// kill and the release of an exec sandbox. The Runtime Server is the gRPC
// client of both, through the connection the agent opened.
//
// Serve is the agent's side; Endpoint the Runtime Server's, whose Executor
// reaches each Run through its agent.
package agent

import (
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/validation"
)

// Headers an agent presents when it dials.
const (
	// HeaderID names the grant (not secret).
	HeaderID = "Stoke-Agent-Id"
	// HeaderAuthorization carries "Bearer SECRET".
	HeaderAuthorization = "Authorization"
)

// Path is where an Endpoint accepts agents.
const Path = "/v1/agent"

// DefaultWait bounds how long an exec waits for its Run's agent.
const DefaultWait = 10 * time.Second

// DefaultNoticeLead is how long before the hosting invocation's deadline
// the agent ends every session with the deadline notice: Lambda's
// deadline kills the sandbox without a word, so sessions are told first.
const DefaultNoticeLead = 5 * time.Second

// heartbeat is how often each end pings the other over HTTP/2 when the
// connection is quiet (gRPC's client floor is 10 s), and how long an
// answer may take before the connection is given up.
const heartbeat = 10 * time.Second

// Flow-control windows and buffers of the agent connection, as between
// runtimed and a Runtime Server: a stream's window holds a few frames, the
// connection's several streams', and one exec frame with its framing is
// one write.
const (
	connBuffer   = 2 * bounds.ExecFrame
	streamWindow = 4 * bounds.ExecFrame
	connWindow   = 4 * streamWindow
	// maxMsg is the largest gRPC message either end takes: one exec frame
	// with room for its envelope.
	maxMsg = bounds.ExecFrame + 64<<10
)

func transportServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg),
		grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(connBuffer), grpc.WriteBufferSize(connBuffer),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: heartbeat, Timeout: heartbeat}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: heartbeat / 2, PermitWithoutStream: true}),
	}
}

func transportDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithReadBufferSize(connBuffer), grpc.WithWriteBufferSize(connBuffer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: heartbeat, Timeout: heartbeat, PermitWithoutStream: true}),
	}
}

// CheckURL checks an agent URL: wss://, or ws:// to a loopback address.
func CheckURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &urlError{raw, err.Error()}
	}
	switch u.Scheme {
	case "wss":
	case "ws":
		if !validation.IsLoopback(u.Hostname()) {
			return nil, &urlError{raw, "plaintext (ws://) is allowed to a loopback address only: use wss://"}
		}
	default:
		return nil, &urlError{raw, "want a ws:// or wss:// URL"}
	}
	if u.Host == "" {
		return nil, &urlError{raw, "no host"}
	}
	return u, nil
}

type urlError struct{ url, why string }

func (e *urlError) Error() string { return "agent URL " + e.url + ": " + e.why }
