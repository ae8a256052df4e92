package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// Resolver maps an exec request to the key of the grant whose agent runs
// it: it checks that the Run is live on this Runtime Server and, where
// the Run's own invocation hosts no agent (a function), opens one that
// does. Its errors are the exec categories (NotFound, NotRunning, ...).
type Resolver func(ctx context.Context, req exec.Request) (key string, err error)

// Executor starts sessions through the agents: the request is resolved,
// its agent awaited for at most the Endpoint's Wait, and the session runs
// on the agent's executor.v1.Exec as on a local Runtime Server.
func (e *Endpoint) Executor(resolve Resolver) exec.Executor {
	return &executor{e: e, resolve: resolve}
}

type executor struct {
	e       *Endpoint
	resolve Resolver
}

func (x *executor) Start(ctx context.Context, req exec.Request) (exec.Session, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	key, err := x.resolve(ctx, req)
	if err != nil {
		return nil, err
	}
	g, c, err := x.e.await(ctx, key, req.RunUID)
	if err != nil {
		return nil, err
	}
	sess, err := c.exec.Start(ctx, req)
	if err != nil {
		return nil, c.explain(err)
	}
	g.sessionStarted()
	x.e.m.sessions.Inc()
	x.e.m.open.Inc()
	return &session{Session: sess, c: c}, nil
}

// await waits, for at most the Endpoint's Wait, until key has a connected
// agent; a deadline notice already given is returned at once.
func (e *Endpoint) await(ctx context.Context, key, run string) (*Grant, *agentConn, error) {
	wctx, cancel := context.WithTimeout(ctx, e.cfg.Wait)
	defer cancel()
	for {
		e.mu.Lock()
		g, ch := e.byKey[key], e.changed
		var c *agentConn
		var expired string
		if g != nil {
			c, expired = g.conn, g.expired
		}
		e.mu.Unlock()
		switch {
		case expired != "":
			return nil, nil, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: exec: %s", run, expired)
		case c != nil:
			return g, c, nil
		}
		select {
		case <-ch:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, nil, fmt.Errorf("run %s: exec: waiting for its agent: %w", run, ctx.Err())
			}
			return nil, nil, errdefs.Errorf(errdefs.ErrUnavailable,
				"run %s: exec: no agent of this Run connected within %s: the invocation hosting it has not dialled back to %s", run, e.cfg.Wait, e.cfg.URL)
		}
	}
}

// explain says why a session failed when its connection or invocation
// ended under it.
func (c *agentConn) explain(err error) error {
	if err == nil {
		return nil
	}
	select {
	case <-c.done:
	default:
		return err
	}
	c.g.e.mu.Lock()
	expired := c.g.expired
	c.g.e.mu.Unlock()
	if expired != "" {
		return errdefs.Errorf(errdefs.ErrNotRunning, "run %s: exec session ended: %s", c.g.run, expired)
	}
	if errors.Is(err, errdefs.ErrNotRunning) {
		return err
	}
	return errdefs.Errorf(errdefs.ErrUnavailable, "run %s: exec session ended: the connection to its agent was lost (%v); the agent redials, and a new exec reaches the Run again", c.g.run, err)
}

// session is a session through an agent.
type session struct {
	exec.Session
	c    *agentConn
	once sync.Once
}

func (s *session) Stream(ctx context.Context, st exec.Streams) (exec.Exit, error) {
	exit, err := s.Session.Stream(ctx, st)
	if err != nil && ctx.Err() == nil {
		// The connection's end may reach this stream before the watch
		// that marks it: wait for that, so that the error says why.
		if errors.Is(err, errdefs.ErrUnavailable) {
			t := time.NewTimer(time.Second)
			select {
			case <-s.c.done:
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		err = s.c.explain(err)
	}
	return exit, err
}

func (s *session) Resize(size exec.TermSize) error { return s.Session.Resize(size) }
func (s *session) Signal(sig syscall.Signal) error { return s.Session.Signal(sig) }

func (s *session) Close() error {
	err := s.Session.Close()
	s.once.Do(func() {
		s.c.g.sessionEnded()
		s.c.g.e.m.open.Dec()
	})
	return err
}
