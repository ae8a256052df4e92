package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/logging"
)

// EndpointConfig configures an Endpoint.
type EndpointConfig struct {
	// URL is what agents dial: the Endpoint's public address with Path
	// (CheckURL).
	URL string
	// Wait bounds how long an exec waits for its Run's agent to connect
	// (default DefaultWait).
	Wait    time.Duration
	Metrics *Metrics
	Logger  *slog.Logger
}

// Endpoint is the Runtime Server's side: it hands out grants, accepts the
// agents that present one, and starts exec sessions through them.
type Endpoint struct {
	cfg EndpointConfig
	log *slog.Logger
	m   *Metrics
	up  websocket.Upgrader

	mu     sync.Mutex
	grants map[string]*Grant // by ID
	byKey  map[string]*Grant // the current grant of each key
	// changed is closed and replaced whenever a grant's state changes.
	changed chan struct{}
	closed  bool
	wg      sync.WaitGroup
}

// NewEndpoint checks cfg and returns an Endpoint.
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	if _, err := CheckURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	return &Endpoint{
		cfg: cfg, log: logging.OrDiscard(cfg.Logger), m: cfg.Metrics,
		up:     websocket.Upgrader{ReadBufferSize: connBuffer, WriteBufferSize: connBuffer, HandshakeTimeout: 10 * time.Second},
		grants: map[string]*Grant{}, byKey: map[string]*Grant{}, changed: make(chan struct{}),
	}, nil
}

// Credentials are what an agent needs to dial: they travel in the
// invocation's payload, never in the function's configuration or a log.
type Credentials struct {
	URL    string `json:"url"`
	ID     string `json:"id"`
	Secret string `json:"secret"`
	// RunUID is the Run the agent serves (not secret: the grant binds it).
	RunUID string `json:"runUid"`
}

// Grant is one invocation's permission for its agent to connect, bound to
// one Run (and, for a function's sandbox, one registration) and valid
// until Revoke or its expiry. At most one connection holds it at a time;
// after that one ends, the agent may redial with it.
type Grant struct {
	e       *Endpoint
	id      string
	secret  []byte
	key     string // the Run's UID, or UID/registration
	run     string
	expires time.Time

	// Guarded by e.mu.
	conn     *agentConn // the live connection, or nil
	claimed  bool       // a connection is being set up
	connects int
	expired  string // the deadline notice, once given
	// firstHello is how long after its invocation reached the sandbox the
	// first connection's Hello was sent (the agent's own measure).
	firstHello time.Duration
	revoked    bool
	// taskEnded is closed when the agent says its task ended and its
	// invocation holds for the write-back (agentv1.TaskEnded).
	taskEnded     chan struct{}
	taskEndedOnce sync.Once
	ended         *agentv1.TaskEnded // the first TaskEnded, set before taskEnded is closed
	sessions      int
	idleTimer     *time.Timer
	idleFor       time.Duration
}

// Grant mints a fresh secret (256 random bits) for the invocation that is
// to host key's agent, valid until expires or Revoke. A grant for the same
// key replaces the previous one in the key's lookup.
func (e *Endpoint) Grant(key, runUID string, expires time.Time) *Grant {
	var id [16]byte
	secret := make([]byte, 32)
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(secret)
	g := &Grant{e: e, id: base64.RawURLEncoding.EncodeToString(id[:]), secret: []byte(base64.RawURLEncoding.EncodeToString(secret)),
		key: key, run: runUID, expires: expires, taskEnded: make(chan struct{})}
	e.mu.Lock()
	e.grants[g.id] = g
	e.byKey[key] = g
	e.notifyLocked()
	e.mu.Unlock()
	return g
}

// Credentials are the grant's, for the invocation's payload.
func (g *Grant) Credentials() Credentials {
	return Credentials{URL: g.e.cfg.URL, ID: g.id, Secret: string(g.secret), RunUID: g.run}
}

// Revoke ends the grant: its connection is closed, its secret refused.
func (g *Grant) Revoke() {
	e := g.e
	e.mu.Lock()
	if g.revoked {
		e.mu.Unlock()
		return
	}
	g.revoked = true
	delete(e.grants, g.id)
	if e.byKey[g.key] == g {
		delete(e.byKey, g.key)
	}
	if g.idleTimer != nil {
		g.idleTimer.Stop()
	}
	c := g.conn
	e.notifyLocked()
	e.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// Connected reports whether the grant's agent is connected now.
func (g *Grant) Connected() bool {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	return g.conn != nil
}

// StartedAfter is how long after the sandbox received the hosting
// invocation the agent's first connection said hello, by the sandbox's
// clock; 0 before it.
func (g *Grant) StartedAfter() time.Duration {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	return g.firstHello
}

// Expired returns the deadline notice the agent gave, or "".
func (g *Grant) Expired() string {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	return g.expired
}

// OnIdle makes f run once no session has been open through the grant for
// d (a function's exec sandbox is released then); the clock starts now.
func (g *Grant) OnIdle(d time.Duration, f func()) {
	e := g.e
	e.mu.Lock()
	defer e.mu.Unlock()
	g.idleFor = d
	g.idleTimer = time.AfterFunc(d, func() {
		e.mu.Lock()
		idle := g.sessions == 0 && !g.revoked
		e.mu.Unlock()
		if idle {
			f()
		}
	})
	if g.sessions > 0 {
		g.idleTimer.Stop()
	}
}

// sessionStarted and sessionEnded count the grant's open sessions, for
// OnIdle.
func (g *Grant) sessionStarted() {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	g.sessions++
	if g.idleTimer != nil {
		g.idleTimer.Stop()
	}
}

func (g *Grant) sessionEnded() {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	g.sessions--
	if g.sessions == 0 && g.idleTimer != nil && !g.revoked {
		g.idleTimer.Reset(g.idleFor)
	}
}

// KillTask tells the agent to kill its task's process group, waiting for
// it to connect within ctx.
func (g *Grant) KillTask(ctx context.Context, reason string) error {
	c, err := g.await(ctx)
	if err != nil {
		return err
	}
	_, err = c.control.KillTask(ctx, &agentv1.KillTaskRequest{Reason: reason})
	return err
}

// TaskEnded is closed once the grant's agent has said that its task ended
// and its invocation holds until Release (a write-back).
func (g *Grant) TaskEnded() <-chan struct{} { return g.taskEnded }

// Ended is what the agent said of its task's end (what it changed); call
// it once TaskEnded is closed.
func (g *Grant) Ended() *agentv1.TaskEnded { return g.ended }

// Release tells a connected agent to end its invocation.
func (g *Grant) Release(ctx context.Context) error {
	g.e.mu.Lock()
	c := g.conn
	g.e.mu.Unlock()
	if c == nil {
		return nil
	}
	_, err := c.control.Release(ctx, &agentv1.ReleaseRequest{})
	return err
}

// Await waits within ctx until the grant's agent is connected.
func (g *Grant) Await(ctx context.Context) error {
	_, err := g.await(ctx)
	return err
}

// await waits within ctx for the grant's agent.
func (g *Grant) await(ctx context.Context) (*agentConn, error) {
	e := g.e
	for {
		e.mu.Lock()
		c, revoked, expired, ch := g.conn, g.revoked, g.expired, e.changed
		e.mu.Unlock()
		switch {
		case expired != "":
			return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: %s", g.run, expired)
		case c != nil:
			return c, nil
		case revoked:
			return nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: the invocation hosting its agent has ended", g.run)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Changed returns a channel closed at the next change of any grant
// (minted, connected, disconnected, given its deadline notice, revoked):
// read it before the state it is to watch, so that no change is missed.
func (e *Endpoint) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

func (e *Endpoint) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// ServeHTTP accepts an agent: its grant ID and secret are checked (the
// secret in constant time) before the upgrade, and anything but a live,
// unexpired grant is refused with 401 and no WebSocket. A grant whose
// connection still lives here is answered 409 and no WebSocket: a
// connection never takes over another, but the agent may have seen its
// connection drop before this end did (a half-open connection ends here
// only at the heartbeat's timeout), so it redials until this end lets go.
func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g, why, busy := e.claim(r)
	if busy {
		e.m.busy.Inc()
		e.log.Info("agent connection answered busy: its grant's connection has not ended here yet", "remote", r.RemoteAddr, "run_uid", g.run)
		http.Error(w, "agent: the grant's connection has not ended here yet; redial", http.StatusConflict)
		return
	}
	if g == nil {
		e.m.refused.Inc()
		e.log.Warn("agent connection refused", "remote", r.RemoteAddr, "reason", why)
		http.Error(w, "agent: not authorized", http.StatusUnauthorized)
		return
	}
	log := e.log.With("run_uid", g.run)
	ws, err := e.up.Upgrade(w, r, nil)
	if err != nil {
		e.unclaim(g)
		log.Warn("agent upgrade failed", "error", err)
		return
	}
	if err := e.attach(g, newWSConn(ws, e.m.count), log); err != nil {
		e.unclaim(g)
		log.Warn("agent connection failed", "error", err)
	}
}

// claim finds and holds the grant a request presents, or says why not;
// busy (with the grant) when the request's credentials are right but a
// connection holds the grant.
func (e *Endpoint) claim(r *http.Request) (g *Grant, why string, busy bool) {
	id := r.Header.Get(HeaderID)
	secret, ok := strings.CutPrefix(r.Header.Get(HeaderAuthorization), "Bearer ")
	e.mu.Lock()
	defer e.mu.Unlock()
	g = e.grants[id]
	want := []byte("\x00no grant: compared to keep the time alike\x00")
	if g != nil {
		want = g.secret
	}
	match := subtle.ConstantTimeCompare([]byte(secret), want) == 1
	switch {
	case e.closed:
		return nil, "the endpoint is closing", false
	case !ok || g == nil || !match:
		return nil, "unknown grant or wrong secret", false
	case g.revoked:
		return nil, "the grant was revoked", false
	case !time.Now().Before(g.expires):
		return nil, "the grant expired", false
	case g.conn != nil || g.claimed:
		return g, "the grant is in use by another connection", true
	}
	g.claimed = true
	return g, "", false
}

func (e *Endpoint) unclaim(g *Grant) {
	e.mu.Lock()
	g.claimed = false
	e.notifyLocked()
	e.mu.Unlock()
}

// agentConn is one live agent connection: gRPC clients of its services.
type agentConn struct {
	g       *Grant
	nc      net.Conn
	cc      *grpc.ClientConn
	exec    exec.Executor
	control agentv1.AgentServiceClient
	done    chan struct{} // closed once the connection has ended
	once    sync.Once
}

func (c *agentConn) close() {
	c.once.Do(func() {
		_ = c.cc.Close()
		_ = c.nc.Close()
	})
}

// attach runs gRPC over nc and waits for the agent's Hello, which must name
// the grant's Run; then the grant is connected until nc ends.
func (e *Endpoint) attach(g *Grant, nc net.Conn, log *slog.Logger) error {
	dialed := false
	var dmu sync.Mutex
	cc, err := grpc.NewClient("passthrough:///agent", append(transportDialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the WebSocket is TLS but on loopback
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			dmu.Lock()
			defer dmu.Unlock()
			if dialed {
				return nil, errors.New("agent connection ended")
			}
			dialed = true
			return nc, nil
		}))...)
	if err != nil {
		nc.Close()
		return err
	}
	c := &agentConn{g: g, nc: nc, cc: cc, exec: exec.NewGRPCClient(cc), control: agentv1.NewAgentServiceClient(cc), done: make(chan struct{})}
	wctx, cancel := context.WithCancel(context.Background())
	watch, err := c.control.Watch(wctx, &agentv1.WatchRequest{})
	var hello *agentv1.WatchResponse
	if err == nil {
		hctx, hcancel := context.WithTimeout(wctx, heartbeat)
		stop := context.AfterFunc(hctx, func() { _ = nc.Close() })
		hello, err = watch.Recv()
		stop()
		hcancel()
	}
	if err != nil || hello.GetHello().GetRunUid() != g.run {
		cancel()
		c.close()
		if err == nil {
			err = fmt.Errorf("the agent serves run %q, not this grant's", hello.GetHello().GetRunUid())
		}
		return fmt.Errorf("agent hello: %w", err)
	}
	e.mu.Lock()
	if e.closed || g.revoked {
		e.mu.Unlock()
		cancel()
		c.close()
		return errors.New("the grant ended while the agent connected")
	}
	g.claimed, g.conn = false, c
	g.connects++
	if g.connects == 1 {
		g.firstHello = time.Duration(hello.GetHello().GetSinceInvocationMicros()) * time.Microsecond
	}
	if g.connects > 1 {
		e.m.redials.Inc()
	}
	e.m.connected.Inc()
	e.notifyLocked()
	e.wg.Add(1)
	e.mu.Unlock()
	log.Info("agent connected", "connects", g.connects)
	go func() {
		defer e.wg.Done()
		defer cancel()
		how := "dropped"
		for {
			m, err := watch.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					how = "ended"
				}
				break
			}
			if m.GetTaskEnded() != nil {
				g.taskEndedOnce.Do(func() {
					g.ended = m.GetTaskEnded()
					close(g.taskEnded)
				})
				log.Info("the agent's task ended; its invocation holds for the write-back")
			}
			if d := m.GetDeadline(); d != nil {
				e.mu.Lock()
				g.expired = d.GetMessage()
				e.notifyLocked()
				e.mu.Unlock()
				log.Info("lifetime_expired: the agent gave the deadline notice", "message", d.GetMessage())
			}
		}
		c.close()
		close(c.done)
		e.mu.Lock()
		if g.conn == c {
			g.conn = nil
		}
		e.m.connected.Dec()
		e.m.disconnects.WithLabelValues(how).Inc()
		e.notifyLocked()
		e.mu.Unlock()
		log.Info("agent disconnected", "how", how)
	}()
	return nil
}

// Close refuses new agents and closes every connection.
func (e *Endpoint) Close() {
	e.mu.Lock()
	e.closed = true
	var conns []*agentConn
	for _, g := range e.grants {
		if g.conn != nil {
			conns = append(conns, g.conn)
		}
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	e.wg.Wait()
}
