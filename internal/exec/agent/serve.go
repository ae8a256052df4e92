package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/logging"
)

// ServeConfig configures the agent inside a sandbox.
type ServeConfig struct {
	Credentials Credentials
	// Exec runs the sessions in the sandbox: an exec.Local whose target
	// is the Run's working directory and env, ending with Lifetime.
	Exec exec.Executor
	// Lifetime gives the deadline notice.
	Lifetime *Lifetime
	// KillTask kills the task's process group; nil when the invocation
	// hosts no task.
	KillTask func(reason string)
	// Release ends an invocation that hosts the agent alone, or one that
	// holds after its task for the write-back (TaskEnded); nil when it
	// hosts a task that ends by itself.
	Release func()
	// TaskEnded, when set, is closed when the task has ended and the
	// invocation holds for its directory to be copied back: Watch then
	// tells the Runtime Server (agentv1.TaskEnded), which copies and
	// calls Release.
	TaskEnded <-chan struct{}
	// TaskEndedEvent, when set, is the event Watch sends once TaskEnded
	// is closed: what the task changed (nil: an empty one).
	TaskEndedEvent func() *agentv1.TaskEnded
	// TLS configures wss:// (nil: the system's roots).
	TLS    *tls.Config
	Logger *slog.Logger
	// Connected, when set, is told of each connection made.
	Connected func()
	// Received is when the sandbox received the invocation hosting the
	// agent; the Hello says how long ago (Hello.since_invocation_micros).
	Received time.Time
	// GiveUp, when positive, ends Serve with an error once it has been
	// without a connection that long (an exec sandbox, which hosts
	// nothing else, then ends).
	GiveUp time.Duration
}

// ErrRefused: the Endpoint refused the credentials (401); redialling with
// them cannot succeed.
var ErrRefused = errors.New("agent: the endpoint refused the credentials")

// Redial backoff: doubling from the first delay to the cap, each delay
// drawn from its upper half (jitter), so that the agents of many sandboxes
// cut off at once do not come back at once.
const (
	redialFirst = 50 * time.Millisecond
	redialCap   = 2 * time.Second
)

// Serve dials the Endpoint and serves exec sessions and the control
// service over the connection until ctx ends. A dropped connection ends
// its sessions (their processes are killed) and is redialled with backoff
// and jitter; ErrRefused ends Serve.
func Serve(ctx context.Context, cfg ServeConfig) error {
	if _, err := CheckURL(cfg.Credentials.URL); err != nil {
		return err
	}
	log := logging.OrDiscard(cfg.Logger).With("run_uid", cfg.Credentials.RunUID)
	delay := redialFirst
	since := time.Now() // without a connection
	for {
		err := serveOnce(ctx, cfg, log)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrRefused):
			log.Warn("agent refused by the endpoint; not redialling")
			return err
		case err == nil: // it was connected, then dropped
			delay, since = redialFirst, time.Now()
		case cfg.GiveUp > 0 && time.Since(since) > cfg.GiveUp:
			return fmt.Errorf("agent: no connection for %s: %w", cfg.GiveUp, err)
		}
		wait := delay/2 + rand.N(delay/2+1)
		log.Info("agent connection ended; redialling", "error", err, "after", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, redialCap)
	}
}

// serveOnce dials and serves one connection until it ends; nil means it
// was connected.
func serveOnce(ctx context.Context, cfg ServeConfig, log *slog.Logger) error {
	d := websocket.Dialer{TLSClientConfig: cfg.TLS, HandshakeTimeout: heartbeat,
		ReadBufferSize: connBuffer, WriteBufferSize: connBuffer, Proxy: http.ProxyFromEnvironment}
	h := http.Header{HeaderID: {cfg.Credentials.ID}, HeaderAuthorization: {"Bearer " + cfg.Credentials.Secret}}
	ws, resp, err := d.DialContext(ctx, cfg.Credentials.URL, h)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return ErrRefused
		}
		if resp != nil {
			// 409: the endpoint still holds this grant's last connection.
			return fmt.Errorf("agent dial: %s: %w", resp.Status, err)
		}
		return fmt.Errorf("agent dial: %w", err)
	}
	conn := &notifyConn{Conn: newWSConn(ws, nil), gone: make(chan struct{})}
	sessions := &inflight{}
	stopping := make(chan struct{})
	srv := grpc.NewServer(append(transportServerOptions(), exec.ServerCodec(),
		grpc.ChainStreamInterceptor(sessions.count, translateStream), grpc.ChainUnaryInterceptor(translateUnary))...)
	pb.RegisterExecServer(srv, exec.NewGRPCServer(cfg.Exec))
	agentv1.RegisterAgentServiceServer(srv, &control{cfg: cfg, log: log, stopping: stopping})
	lis := &oneListener{c: conn, closed: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	log.Info("agent connected")
	if cfg.Connected != nil {
		cfg.Connected()
	}
	select {
	case <-conn.gone:
		srv.Stop()
	case <-ctx.Done():
		// Sessions that have just ended (their Run did) send their end
		// first; Stop then ends the rest, killing what they ran. The
		// watch ends after the sessions (the Runtime Server closes the
		// connection when it ends), so that GracefulStop does not wait
		// for it until Stop.
		t := time.AfterFunc(time.Second, srv.Stop)
		select {
		case <-sessions.idle():
		case <-conn.gone:
		}
		close(stopping)
		srv.GracefulStop()
		t.Stop()
	}
	_ = conn.Close()
	_ = lis.Close()
	<-served
	return nil
}

// inflight counts the streams a connection serves other than the watch:
// the exec sessions.
type inflight struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed while n == 0; nil: none yet
}

func (f *inflight) count(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod == agentv1.AgentService_Watch_FullMethodName {
		return h(srv, ss)
	}
	f.mu.Lock()
	if f.n == 0 {
		f.none = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if f.n--; f.n == 0 {
			close(f.none)
		}
		f.mu.Unlock()
	}()
	return h(srv, ss)
}

// idle is closed once no session is in flight.
func (f *inflight) idle() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	return f.none
}

// control serves agent.v1.AgentService.
type control struct {
	agentv1.UnimplementedAgentServiceServer
	cfg ServeConfig
	log *slog.Logger
	// stopping ends Watch when the agent stops, so that GracefulStop
	// waits for exec sessions only, not for the watch the Runtime Server
	// keeps open (the sandbox's invocation would last until Stop's
	// fallback fired).
	stopping <-chan struct{}
}

func (c *control) Watch(_ *agentv1.WatchRequest, stream agentv1.AgentService_WatchServer) error {
	l := c.cfg.Lifetime
	if err := stream.Send(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Hello{Hello: &agentv1.Hello{
		RunUid: c.cfg.Credentials.RunUID, DeadlineUnixMillis: l.Deadline().UnixMilli(), SinceInvocationMicros: since(c.cfg.Received)}}}); err != nil {
		return err
	}
	ended := c.cfg.TaskEnded
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-c.stopping:
			return nil
		case <-ended:
			ended = nil // told once per watch (a redialled agent tells again)
			ev := &agentv1.TaskEnded{}
			if c.cfg.TaskEndedEvent != nil {
				ev = c.cfg.TaskEndedEvent()
			}
			if err := stream.Send(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_TaskEnded{TaskEnded: ev}}); err != nil {
				return err
			}
			continue
		case <-l.Ended():
		}
		break
	}
	c.log.Info("lifetime_expired: deadline notice given", "deadline", l.Deadline())
	if err := stream.Send(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Deadline{Deadline: &agentv1.Deadline{
		Message: l.Message(), DeadlineUnixMillis: l.Deadline().UnixMilli()}}}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-c.stopping:
	}
	return nil
}

func (c *control) KillTask(_ context.Context, req *agentv1.KillTaskRequest) (*agentv1.KillTaskResponse, error) {
	if c.cfg.KillTask == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "agent: this invocation hosts no task")
	}
	c.log.Info("killing the task", "reason", req.GetReason())
	c.cfg.KillTask(req.GetReason())
	return &agentv1.KillTaskResponse{}, nil
}

func (c *control) Release(context.Context, *agentv1.ReleaseRequest) (*agentv1.ReleaseResponse, error) {
	if c.cfg.Release == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "agent: this invocation hosts a task, which ends by itself")
	}
	c.log.Info("the invocation is released")
	c.cfg.Release()
	return &agentv1.ReleaseResponse{}, nil
}

// translateStream and translateUnary map error categories to gRPC codes
// at this edge, as the Runtime Server's interceptors do at its own.
func translateStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return errdefs.ToGRPC(h(srv, ss))
}

func translateUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, errdefs.ToGRPC(err)
}

// Lifetime is the hosting invocation's: it ends lead before its deadline,
// with a message saying so.
type Lifetime struct {
	deadline time.Time
	message  string
	ended    chan struct{}
	timer    *time.Timer
	stopped  chan struct{}
	stopOnce sync.Once
}

// NewLifetime ends lead before deadline (at once if that has passed);
// message says why. A zero deadline never ends. Stop releases it.
func NewLifetime(deadline time.Time, lead time.Duration, message string) *Lifetime {
	l := &Lifetime{deadline: deadline, message: message, ended: make(chan struct{}), stopped: make(chan struct{})}
	if !deadline.IsZero() {
		l.timer = time.AfterFunc(time.Until(deadline.Add(-lead)), func() { close(l.ended) })
	}
	return l
}

// Ended is closed at the notice.
func (l *Lifetime) Ended() <-chan struct{} { return l.ended }

// Message says why the sessions end.
func (l *Lifetime) Message() string { return l.message }

// Deadline is the invocation's deadline.
func (l *Lifetime) Deadline() time.Time { return l.deadline }

// Stop releases the timer and the targets' watches; the lifetime then
// never ends.
func (l *Lifetime) Stop() {
	l.stopOnce.Do(func() {
		if l.timer != nil {
			l.timer.Stop()
		}
		close(l.stopped)
	})
}

// Targets are base's, each ending with its Run or at the notice,
// whichever comes first, saying which; after the notice no session
// starts.
func (l *Lifetime) Targets(base exec.Targets) exec.Targets {
	return lifetimeTargets{l: l, base: base}
}

type lifetimeTargets struct {
	l    *Lifetime
	base exec.Targets
}

func (lt lifetimeTargets) ExecTarget(runUID, registrationID string) (exec.Target, error) {
	select {
	case <-lt.l.ended:
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: %s", runUID, lt.l.message)
	default:
	}
	t, err := lt.base.ExecTarget(runUID, registrationID)
	if err != nil {
		return t, err
	}
	ended, baseEnded, baseReason := make(chan struct{}), t.Ended, t.Reason
	var mu sync.Mutex
	reason := ""
	go func() {
		var r string
		select {
		case <-baseEnded:
			r = baseReason()
		case <-lt.l.ended:
			r = lt.l.message
		case <-lt.l.stopped:
			return
		}
		mu.Lock()
		reason = r
		mu.Unlock()
		close(ended)
	}()
	t.Ended = ended
	t.Reason = func() string {
		mu.Lock()
		defer mu.Unlock()
		return reason
	}
	return t, nil
}

// notifyConn closes gone when gRPC closes the connection (its transport
// ended: the peer went, a read failed, a heartbeat went unanswered).
type notifyConn struct {
	net.Conn
	once sync.Once
	gone chan struct{}
}

func (c *notifyConn) Close() error {
	c.once.Do(func() { close(c.gone) })
	return c.Conn.Close()
}

// oneListener hands one connection to a gRPC server, then blocks until
// closed.
type oneListener struct {
	mu     sync.Mutex
	c      net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *oneListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneListener) Addr() net.Addr { return agentAddr{} }

type agentAddr struct{}

func (agentAddr) Network() string { return "agent" }
func (agentAddr) String() string  { return "agent" }

// since is the time since t in microseconds, 0 for no t.
func since(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return time.Since(t).Microseconds()
}
