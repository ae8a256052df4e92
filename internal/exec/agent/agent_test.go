package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/exec/exectest"
)

// rig is an Endpoint on loopback with agents served in this process, each
// running its sessions with a real exec.Local in a directory of its own,
// as a bootstrap does in a sandbox.
type rig struct {
	ep   *agent.Endpoint
	m    *agent.Metrics
	url  string
	addr string
	mu   sync.Mutex
	runs map[string]*fakeRun
}

type fakeRun struct {
	dir   string
	ended chan struct{}
	once  sync.Once
	grant *agent.Grant
}

func (r *fakeRun) end() { r.once.Do(func() { close(r.ended) }) }

func newRig(t *testing.T, wait time.Duration) *rig {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rg := &rig{addr: lis.Addr().String(), runs: map[string]*fakeRun{}, m: agent.NewMetrics()}
	rg.url = "ws://" + rg.addr + agent.Path
	rg.ep, err = agent.NewEndpoint(agent.EndpointConfig{URL: rg.url, Wait: wait, Metrics: rg.m})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rg.ep, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		_ = srv.Close()
		rg.ep.Close()
	})
	return rg
}

// resolve is the Runtime Server's part: the Run must be live here.
func (rg *rig) resolve(_ context.Context, req exec.Request) (string, error) {
	rg.mu.Lock()
	r := rg.runs[req.RunUID]
	rg.mu.Unlock()
	if r == nil {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "run %s: not here", req.RunUID)
	}
	select {
	case <-r.ended:
		return "", errdefs.Errorf(errdefs.ErrNotRunning, "run %s has ended", req.RunUID)
	default:
	}
	return req.RunUID, nil
}

type dirTarget struct{ r *fakeRun }

func (d dirTarget) ExecTarget(string, string) (exec.Target, error) {
	return exec.Target{Dir: d.r.dir, Env: []string{"PATH=/usr/bin:/bin", "RUN_VAR=in-the-sandbox"}, Ended: d.r.ended,
		Reason: func() string { return "its execution ended" }}, nil
}

// serveAgent runs an agent for c until the test ends, dialling url.
func serveAgent(t *testing.T, c agent.Credentials, r *fakeRun, lt *agent.Lifetime, url string) {
	t.Helper()
	local := exec.NewLocal(exec.LocalConfig{Targets: lt.Targets(dirTarget{r})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.URL = url
	go func() {
		defer close(done)
		_ = agent.Serve(ctx, agent.ServeConfig{Credentials: c, Exec: local, Lifetime: lt})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		local.Close()
		lt.Stop()
	})
}

// run starts a Run with its agent connected (through url, default the
// endpoint's own).
func (rg *rig) run(t *testing.T, uid string, lt *agent.Lifetime, url string) *fakeRun {
	t.Helper()
	r := &fakeRun{dir: t.TempDir(), ended: make(chan struct{})}
	r.grant = rg.ep.Grant(uid, uid, time.Now().Add(time.Hour))
	rg.mu.Lock()
	rg.runs[uid] = r
	rg.mu.Unlock()
	if lt == nil {
		lt = agent.NewLifetime(time.Time{}, 0, "")
	}
	if url == "" {
		url = rg.url
	}
	serveAgent(t, r.grant.Credentials(), r, lt, url)
	t.Cleanup(r.end)
	return r
}

var uids sync.Map

func uniqueUID(t *testing.T) string {
	for i := 0; ; i++ {
		uid := strings.ReplaceAll(t.Name(), "/", "-") + "-" + string(rune('a'+i%26)) + time.Now().Format("150405.000000000")
		if _, dup := uids.LoadOrStore(uid, true); !dup {
			return uid
		}
	}
}

// The exec suite through the reverse agent: the same stream, semantics and
// bounds as into a local Run.
func TestExecSuiteThroughTheAgent(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	exectest.Test(t, exectest.Harness{
		Executor: rg.ep.Executor(rg.resolve), Signals: true, RequestEnv: true, Pids: true, BigBytes: 64 << 20, Stall: 500 * time.Millisecond,
		Task: func(t *testing.T) exectest.Run {
			uid := uniqueUID(t)
			r := rg.run(t, uid, nil, "")
			return exectest.Run{UID: uid, Dir: r.dir, Env: map[string]string{"RUN_VAR": "in-the-sandbox"}, End: func(*testing.T) { r.end() }}
		},
	})
}

// dial presents headers to the endpoint as an agent would.
func dial(t *testing.T, url string, h http.Header) (*websocket.Conn, int, string) {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err == nil {
		return ws, http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return nil, resp.StatusCode, string(body)
}

func creds(id, secret string) http.Header {
	h := http.Header{}
	if id != "" {
		h.Set(agent.HeaderID, id)
	}
	if secret != "" {
		h.Set(agent.HeaderAuthorization, "Bearer "+secret)
	}
	return h
}

// Anything but a live grant's own secret, presented by the one connection
// that holds it, is refused with 401 before the upgrade: the refused
// connection never becomes a WebSocket, so it never sees a byte of any
// session, and the sessions of the live agent go on untouched.
func TestAgentAuthentication(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	x := rg.ep.Executor(rg.resolve)
	a := rg.run(t, "run-a", nil, "")
	b := rg.run(t, "run-b", nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	// A session through a's agent, open during the attempts.
	sess, err := x.Start(ctx, exec.Request{RunUID: "run-a", Command: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	inR, inW := io.Pipe()
	screen := exectest.NewScreen()
	streamed := make(chan error, 1)
	go func() {
		_, err := sess.Stream(ctx, exec.Streams{Stdin: inR, Stdout: screen})
		streamed <- err
	}()
	_, _ = io.WriteString(inW, "secret-session-bytes-1\n")
	screen.Expect(t, "secret-session-bytes-1\n")

	ca, cb := a.grant.Credentials(), b.grant.Credentials()
	expired := rg.ep.Grant("run-c", "run-c", time.Now().Add(-time.Second))
	revoked := rg.ep.Grant("run-d", "run-d", time.Now().Add(time.Hour))
	cd := revoked.Credentials()
	revoked.Revoke()
	forged := []byte(ca.Secret)
	forged[0] ^= 1
	for _, tc := range []struct {
		name string
		h    http.Header
		want int
	}{
		{"Missing", creds(ca.ID, ""), http.StatusUnauthorized},
		{"MissingID", creds("", ca.Secret), http.StatusUnauthorized},
		{"Forged", creds(ca.ID, string(forged)), http.StatusUnauthorized},
		{"CrossRun", creds(cb.ID, ca.Secret), http.StatusUnauthorized},
		// Right, but a's connection lives: busy, and no take-over.
		{"ReplayedWhileConnected", creds(ca.ID, ca.Secret), http.StatusConflict},
		{"Expired", creds(expired.Credentials().ID, expired.Credentials().Secret), http.StatusUnauthorized},
		{"Revoked", creds(cd.ID, cd.Secret), http.StatusUnauthorized},
	} {
		ws, code, body := dial(t, rg.url, tc.h)
		if ws != nil {
			ws.Close()
			t.Errorf("%s: upgraded; want %d", tc.name, tc.want)
			continue
		}
		if code != tc.want || strings.Contains(body, "secret-session") {
			t.Errorf("%s: %d %q; want %d and no session byte", tc.name, code, body, tc.want)
		}
	}
	if expired.Connected() {
		t.Error("an expired grant attached")
	}
	// Nothing attached or took over: a's session goes on.
	_, _ = io.WriteString(inW, "secret-session-bytes-2\n")
	screen.Expect(t, "secret-session-bytes-2\n")
	inW.Close()
	if err := <-streamed; err != nil {
		t.Fatalf("a's session after the attempts: %v", err)
	}
	if !a.grant.Connected() || !b.grant.Connected() {
		t.Fatal("a refused attempt disturbed a connected agent")
	}
}

// proxy is a TCP relay the test can cut, as a network would.
type proxy struct {
	lis   net.Listener
	mu    sync.Mutex
	conns []net.Conn // the agent's side, then the endpoint's, of each
	// halfOpen keeps the endpoint's side open when the agent's closes.
	halfOpen atomic.Bool
}

func newProxy(t *testing.T, to string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() {
				_, _ = io.Copy(u, c)
				if !p.halfOpen.Load() {
					u.Close()
				}
			}()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(func() { lis.Close(); p.cut() })
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// dropAgentSide closes the agent's side of every connection and leaves
// the endpoint's open, as a NAT that forgot the flow would: the agent
// sees its connection end, the endpoint does not (until its heartbeat).
func (p *proxy) dropAgentSide() {
	p.halfOpen.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.conns); i += 2 {
		p.conns[i].Close()
	}
}

// An agent that redials while the endpoint still holds its last
// connection (half-open there) is answered busy, not refused: it keeps
// redialling, and is connected once the endpoint lets the old connection
// go. A 401 there ended the agent for good.
func TestRedialWhileTheEndpointHoldsTheOldConnection(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	p := newProxy(t, rg.addr)
	r := rg.run(t, "run-half", nil, "ws://"+p.lis.Addr().String()+agent.Path)
	actx, acancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer acancel()
	if err := r.grant.Await(actx); err != nil {
		t.Fatal(err)
	}
	p.dropAgentSide()
	deadline := time.Now().Add(exectest.Timeout)
	for counter(t, rg.m, "stoke_agent_busy_total", "") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never redialled while the endpoint held its connection")
		}
		time.Sleep(5 * time.Millisecond) // polling a metric: the endpoint has no event for a busy answer
	}
	if !r.grant.Connected() {
		t.Fatal("the endpoint let go of the half-open connection before the test cut it")
	}
	p.cut() // the endpoint's side ends, as its heartbeat would end it
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	for {
		changed := rg.ep.Changed()
		if disconnects(t, rg.m, "dropped") >= 1 {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the endpoint never saw the old connection end")
		}
	}
	if err := r.grant.Await(ctx); err != nil {
		t.Fatalf("the agent did not connect again: %v", err)
	}
	x := rg.ep.Executor(rg.resolve)
	out, _, exit, err := exectest.Collect(ctx, x, exec.Request{RunUID: "run-half", Command: []string{"echo", "back"}}, nil)
	if err != nil || exit.Code != 0 || out != "back\n" {
		t.Fatalf("after the endpoint let go: %q %+v %v", out, exit, err)
	}
	if n := counter(t, rg.m, "stoke_agent_refused_total", ""); n != 0 {
		t.Errorf("%v connections refused; want none", n)
	}
}

// A connection cut mid-session ends the session with a clear error and
// kills what it ran; the agent redials and a new exec works.
func TestCutConnectionRedials(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	p := newProxy(t, rg.addr)
	rg.run(t, "run-cut", nil, "ws://"+p.lis.Addr().String()+agent.Path)
	x := rg.ep.Executor(rg.resolve)
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	marker := exectest.Marker()
	sess, err := x.Start(ctx, exec.Request{RunUID: "run-cut", Command: []string{"sleep", marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 1 })
	p.cut()
	_, err = sess.Stream(ctx, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "connection to its agent was lost") {
		t.Fatalf("the cut session ended with %v; want Unavailable saying the connection was lost", err)
	}
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	out, _, exit, err := exectest.Collect(ctx, x, exec.Request{RunUID: "run-cut", Command: []string{"echo", "back"}}, nil)
	if err != nil || exit.Code != 0 || out != "back\n" {
		t.Fatalf("after the redial: %q %+v %v", out, exit, err)
	}
}

// An agent that stops (its invocation is over) ends the Runtime Server's
// watch itself: the endpoint counts the connection ended, not dropped, and
// the agent does not wait for the watch until its stop's fallback cuts it.
func TestAgentStopEndsTheWatch(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	r := &fakeRun{dir: t.TempDir(), ended: make(chan struct{})}
	r.grant = rg.ep.Grant("run-stop", "run-stop", time.Now().Add(time.Hour))
	lt := agent.NewLifetime(time.Time{}, 0, "")
	defer lt.Stop()
	local := exec.NewLocal(exec.LocalConfig{Targets: lt.Targets(dirTarget{r})})
	defer local.Close()
	c := r.grant.Credentials()
	c.URL = rg.url
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- agent.Serve(sctx, agent.ServeConfig{Credentials: c, Exec: local, Lifetime: lt}) }()
	if err := r.grant.Await(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	for r.grant.Connected() {
		select {
		case <-ctx.Done():
			t.Fatal("the endpoint never saw the agent go")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if ended, dropped := disconnects(t, rg.m, "ended"), disconnects(t, rg.m, "dropped"); ended != 1 || dropped != 0 {
		t.Fatalf("disconnects: ended %v, dropped %v; want 1 and 0", ended, dropped)
	}
}

// counter is the value of the counter name of m: of its series with
// label how (when how is not ""), or its one series.
func counter(t *testing.T, m *agent.Metrics, name, how string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if how == "" {
				return mt.GetCounter().GetValue()
			}
			for _, l := range mt.GetLabel() {
				if l.GetName() == "how" && l.GetValue() == how {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// disconnects is stoke_agent_disconnects_total{how}.
func disconnects(t *testing.T, m *agent.Metrics, how string) float64 {
	t.Helper()
	return counter(t, m, "stoke_agent_disconnects_total", how)
}

// Before the invocation's deadline every session gets the deadline notice
// and later execs get it at once.
func TestDeadlineNotice(t *testing.T) {
	rg := newRig(t, 10*time.Second)
	// The notice comes lead before the deadline: here in a moment.
	deadline := time.Now().Add(agent.DefaultNoticeLead + 1500*time.Millisecond)
	lt := agent.NewLifetime(deadline, agent.DefaultNoticeLead, "lifetime_expired: the Lambda invocation hosting this Run reaches its deadline")
	r := rg.run(t, "run-deadline", lt, "")
	x := rg.ep.Executor(rg.resolve)
	ctx, cancel := context.WithTimeout(context.Background(), exectest.Timeout)
	defer cancel()
	marker := exectest.Marker()
	sess, err := x.Start(ctx, exec.Request{RunUID: "run-deadline", Command: []string{"sleep", marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	_, err = sess.Stream(ctx, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
	if !errors.Is(err, errdefs.ErrNotRunning) || !strings.Contains(err.Error(), "reaches its deadline") {
		t.Fatalf("the session ended with %v; want the deadline notice", err)
	}
	if left := time.Until(deadline); left < agent.DefaultNoticeLead-time.Second {
		t.Errorf("the notice came %s before the deadline; want about %s", left, agent.DefaultNoticeLead)
	}
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	// The Runtime Server learns it through the watch; later execs fail at
	// once with it.
	for r.grant.Expired() == "" {
		select {
		case <-ctx.Done():
			t.Fatal("the endpoint never learnt of the notice")
		case <-time.After(10 * time.Millisecond):
		}
	}
	_, err = x.Start(ctx, exec.Request{RunUID: "run-deadline", Command: []string{"true"}})
	if !errors.Is(err, errdefs.ErrNotRunning) || !strings.Contains(err.Error(), "lifetime_expired") {
		t.Fatalf("an exec after the notice: %v", err)
	}
}

// An exec whose Run has no agent fails within the bound with a clear
// error, and never hangs.
func TestNoAgentFailsWithinTheBound(t *testing.T) {
	rg := newRig(t, 200*time.Millisecond)
	rg.mu.Lock()
	rg.runs["run-silent"] = &fakeRun{ended: make(chan struct{})}
	rg.mu.Unlock()
	rg.ep.Grant("run-silent", "run-silent", time.Now().Add(time.Hour))
	_, err := rg.ep.Executor(rg.resolve).Start(context.Background(), exec.Request{RunUID: "run-silent", Command: []string{"true"}})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no agent of this Run connected within 200ms") {
		t.Fatalf("%v; want Unavailable naming the bound", err)
	}
}

// Plaintext goes to loopback only.
func TestCheckURL(t *testing.T) {
	for url, ok := range map[string]bool{
		"ws://127.0.0.1:1/v1/agent": true, "ws://[::1]:1/v1/agent": true, "ws://localhost:1/v1/agent": true,
		"wss://stoke.example.com/v1/agent": true, "ws://stoke.example.com/v1/agent": false, "ws://10.0.0.1:1/": false,
		"http://127.0.0.1:1/": false,
	} {
		if _, err := agent.CheckURL(url); (err == nil) != ok {
			t.Errorf("%s: %v", url, err)
		}
	}
}
