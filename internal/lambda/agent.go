package lambda

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/validation"
)

// Exec into a Run on Lambda goes through exec's reverse agent
// (internal/exec/agent): the invocation that runs a task, or a dedicated
// invocation of a function (its exec sandbox), carries a fresh grant, and
// its bootstrap dials back to this server's agent endpoint and serves the
// sessions. Nothing of an exec ever runs on this machine.

// DefaultSandboxIdle is how long a function's exec sandbox stays with no
// session open before it is released.
const DefaultSandboxIdle = 30 * time.Second

// agentEndpoint listens for agents as cfg says: plaintext only on a
// loopback address, TLS otherwise.
func startAgentEndpoint(cfg *Config) (*agent.Endpoint, *http.Server, error) {
	if cfg.AgentListen == "" {
		cfg.AgentListen = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(cfg.AgentListen)
	if err != nil {
		return nil, nil, fmt.Errorf("lambda agent listen address %q: %w", cfg.AgentListen, err)
	}
	tlsOn := cfg.AgentCert != "" || cfg.AgentKey != ""
	if !tlsOn && !validation.IsLoopback(host) {
		return nil, nil, fmt.Errorf("lambda agent endpoint %s: plaintext is allowed on a loopback address only: give --lambda-agent-cert and --lambda-agent-key", cfg.AgentListen)
	}
	var tc *tls.Config
	if tlsOn {
		cert, err := tls.LoadX509KeyPair(cfg.AgentCert, cfg.AgentKey)
		if err != nil {
			return nil, nil, fmt.Errorf("lambda agent endpoint: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	lis, err := net.Listen("tcp", cfg.AgentListen)
	if err != nil {
		return nil, nil, fmt.Errorf("lambda agent endpoint: %w", err)
	}
	if cfg.AgentURL == "" {
		scheme := "ws"
		if tlsOn {
			scheme = "wss"
		}
		cfg.AgentURL = scheme + "://" + lis.Addr().String() + agent.Path
	}
	ep, err := agent.NewEndpoint(agent.EndpointConfig{URL: cfg.AgentURL, Wait: cfg.AgentWait, Metrics: cfg.AgentMetrics, Logger: cfg.Logger})
	if err != nil {
		lis.Close()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+agent.Path, ep)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tc,
		MaxHeaderBytes: 16 << 10}
	go func() {
		if tc != nil {
			_ = srv.ServeTLS(lis, "", "")
		} else {
			_ = srv.Serve(lis)
		}
	}()
	cfg.Logger.Info("lambda agent endpoint listening", "addr", lis.Addr().String(), "url", cfg.AgentURL, "tls", tlsOn)
	return ep, srv, nil
}

// Executor is the exec service of a lambda Runtime Server: every session
// reaches its Run through the Run's agent, never this machine. targets are
// the core's, which say whether the Run is live here.
func (s *Server) Executor(targets exec.Targets) exec.Executor {
	return s.agents.Executor(func(ctx context.Context, req exec.Request) (string, error) {
		t, err := targets.ExecTarget(req.RunUID, req.RegistrationID)
		if err != nil {
			return "", err
		}
		if req.RegistrationID == "" {
			return taskKey(t.Dir), nil
		}
		return s.openSandbox(ctx, req.RunUID, req.RegistrationID)
	})
}

// taskKey names a task's grant by its working directory, which both the
// core's execution and the relay know.
func taskKey(dir string) string {
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	return "task:" + dir
}

// TaskAgent reports whether the agent of the task in dir is connected
// now, and a channel closed at the next change of any agent
// (runtime.AgentReporter: the Run's status says so).
func (s *Server) TaskAgent(dir string) (connected bool, changed <-chan struct{}) {
	changed = s.agents.Changed() // first, so that no change is missed
	s.mu.Lock()
	g := s.taskGrants[taskKey(dir)]
	s.mu.Unlock()
	return g != nil && g.Connected(), changed
}

// taskGrant mints the grant of a task's invocation.
func (s *Server) taskGrant(dir, uid string, expires time.Time) (*agent.Grant, *payload.Agent) {
	key := taskKey(dir)
	g := s.agents.Grant(key, uid, expires)
	s.mu.Lock()
	s.taskGrants[key] = g
	s.mu.Unlock()
	c := g.Credentials()
	return g, &payload.Agent{URL: c.URL, ID: c.ID, Secret: c.Secret, RunUID: c.RunUID}
}

func (s *Server) dropTaskGrant(dir string, g *agent.Grant) {
	g.Revoke()
	key := taskKey(dir)
	s.mu.Lock()
	if s.taskGrants[key] == g {
		delete(s.taskGrants, key)
	}
	s.mu.Unlock()
}

// killTask tells a cancelled task's agent to kill its process group, so
// that the invocation ends; a task whose agent never connects runs on
// until its deadline (logged).
func (s *Server) killTask(g *agent.Grant, uid string) {
	ctx, cancel := context.WithTimeout(s.bgCtx, agent.DefaultWait)
	defer cancel()
	if err := g.KillTask(ctx, "the Run was cancelled or timed out"); err != nil {
		s.log.Warn("the task's agent could not kill it; it runs until its deadline", "run_uid", uid, "error", err)
		return
	}
	s.log.Info("the task was killed in its sandbox", "run_uid", uid)
}

// openSandbox returns the key of the exec sandbox of a function Run's
// registration, starting one (an invocation of the function that hosts
// the agent alone) when none is open.
func (s *Server) openSandbox(ctx context.Context, uid, regID string) (string, error) {
	key := "function:" + uid + "/" + regID
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sandboxes[key]; ok {
		return key, nil
	}
	inst := s.instances[uid]
	if inst == nil {
		return "", errdefs.Errorf(errdefs.ErrNotRunning, "run %s: its function is not loaded on Lambda", uid)
	}
	if s.closing {
		return "", errdefs.Errorf(errdefs.ErrUnavailable, "run %s: exec: the runtime server is shutting down", uid)
	}
	timeout := bounds.MaxInvokeTimeout
	g := s.agents.Grant(key, uid, time.Now().Add(timeout+taskAnswerRoom))
	c := g.Credentials()
	ev, err := json.Marshal(payload.Request{Kind: payload.KindAgent, TimeoutMillis: timeout.Milliseconds(),
		Agent: &payload.Agent{URL: c.URL, ID: c.ID, Secret: c.Secret, RunUID: c.RunUID}})
	if err != nil {
		g.Revoke()
		return "", err
	}
	s.sandboxes[key] = g
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ictx, cancel := context.WithTimeout(s.bgCtx, timeout+taskAnswerRoom)
		defer cancel()
		_, err := s.inv.Invoke(ictx, &awslambda.InvokeInput{FunctionName: aws.String(inst.name), Payload: ev})
		if err != nil {
			s.log.Warn("the exec sandbox's invocation failed", "run_uid", uid, "error", awsError("Invoke", err))
		}
		g.Revoke()
		s.mu.Lock()
		delete(s.sandboxes, key)
		s.mu.Unlock()
	}()
	g.OnIdle(s.cfg.SandboxIdle, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.Release(rctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Warn("releasing the exec sandbox failed", "run_uid", uid, "error", err)
		}
		g.Revoke()
	})
	s.log.Info("exec sandbox opened", "run_uid", uid, "function", inst.name)
	_ = ctx
	return key, nil
}

// closeSandboxes releases the exec sandboxes of a Run whose registration
// ends.
func (s *Server) closeSandboxes(uid string) {
	s.mu.Lock()
	var gs []*agent.Grant
	for key, g := range s.sandboxes {
		if len(key) > len("function:"+uid+"/") && key[:len("function:"+uid+"/")] == "function:"+uid+"/" {
			gs = append(gs, g)
		}
	}
	s.mu.Unlock()
	for _, g := range gs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = g.Release(ctx)
		cancel()
		g.Revoke()
	}
}
