package bootstrap

import (
	"context"
	"time"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/runtime"
)

// serveAgent serves exec's reverse agent for one invocation: sessions run
// in base's working directory and env and end with it, or with the
// deadline notice (agent.DefaultNoticeLead before Lambda's deadline),
// whichever comes first. kill (a task's) and release (a sandbox's) are
// what the Runtime Server may ask for. The returned stop ends the agent
// and every session, killing what they started.
func (b *Bootstrap) serveAgent(ctx context.Context, deadline, received time.Time, a *payload.Agent, base exec.Target, kill func(string), release func(), taskEnded <-chan struct{}, event func() *agentv1.TaskEnded) (stop func()) {
	msg := "lifetime_expired: the Lambda invocation hosting this Run reaches its deadline"
	if !deadline.IsZero() {
		msg += " at " + deadline.UTC().Format(time.RFC3339)
	}
	lt := agent.NewLifetime(deadline, agent.DefaultNoticeLead, msg)
	log := b.log.With("run_uid", a.RunUID)
	local := exec.NewLocal(exec.LocalConfig{Targets: lt.Targets(oneTarget{base}), Logger: log})
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	cfg := agent.ServeConfig{
		Credentials: agent.Credentials{URL: a.URL, ID: a.ID, Secret: a.Secret, RunUID: a.RunUID},
		Exec:        local, Lifetime: lt, KillTask: kill, Release: release, Logger: log,
		Received: received, TaskEnded: taskEnded, TaskEndedEvent: event,
	}
	if release != nil && taskEnded == nil {
		// A sandbox hosts the agent alone: it ends when the agent cannot
		// reach its Runtime Server any more.
		cfg.GiveUp = 3 * agent.DefaultWait
	}
	go func() {
		defer close(done)
		err := agent.Serve(actx, cfg)
		if err != nil {
			log.Warn("the reverse agent stopped", "error", err)
			if release != nil {
				release()
			}
		}
	}()
	return func() {
		cancel()
		<-done
		local.Close()
		lt.Stop()
	}
}

// oneTarget is the sandbox's one Run: the Runtime Server has routed the
// request here already.
type oneTarget struct{ t exec.Target }

func (o oneTarget) ExecTarget(runUID, _ string) (exec.Target, error) {
	select {
	case <-o.t.Ended:
		return exec.Target{}, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: %s", runUID, o.t.Reason())
	default:
		return o.t, nil
	}
}

// sandbox hosts the agent alone in a sandbox of the function, for exec:
// sessions run in the registration's working directory and env, like a
// debug container, until the Runtime Server releases the sandbox (no
// session needs it) or the invocation's deadline.
func (b *Bootstrap) sandbox(ctx context.Context, ev event, req payload.Request) (*payload.Response, *payload.Error) {
	if b.fns == nil || req.Agent == nil {
		return nil, &payload.Error{Type: payload.ErrorBadRequest, Message: "an exec sandbox needs a function and an agent"}
	}
	target, err := b.fns.ExecTarget(b.reg)
	if err != nil {
		return nil, errorPayload(err)
	}
	rctx, release := context.WithCancel(ctx)
	defer release()
	stop := b.serveAgent(rctx, ev.deadline, ev.received, req.Agent, target, nil, release, nil, nil)
	<-rctx.Done()
	stop()
	return &payload.Response{}, nil
}

// taskAgent serves the task's agent, when the request has one, until
// stop: its sessions end with the task, or, with a hold (a write-back),
// when the Runtime Server releases the invocation after the task, and the
// agent outlives the task's own timeout until then.
func (b *Bootstrap) taskAgent(ctx context.Context, ev event, req payload.Request, tasks *runtime.Tasks, h *hold) (stop func()) {
	if req.Agent == nil {
		return func() {}
	}
	target, err := tasks.ExecTarget(ev.requestID)
	if err != nil {
		b.log.Warn("no exec target for the task's agent", "error", err)
		return func() {}
	}
	kill := func(reason string) {
		b.log.Info("the task is killed at the Runtime Server's request", "reason", reason)
		_, _ = tasks.Cancel(context.WithoutCancel(ctx), &pb.CancelRequest{Id: ev.requestID})
	}
	if h == nil {
		return b.serveAgent(ctx, ev.deadline, ev.received, req.Agent, target, kill, nil, nil, nil)
	}
	// The hold's sessions (the Runtime Server's tar of the directory)
	// run after the task, until the release.
	target.Ended, target.Reason = h.released, func() string { return "the invocation was released" }
	actx := context.WithoutCancel(ctx)
	if !ev.deadline.IsZero() {
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(actx, ev.deadline.Add(-deadlineMargin))
		stopAgent := b.serveAgent(actx, ev.deadline, ev.received, req.Agent, target, kill, h.release, h.ended, h.taskEnded)
		return func() {
			stopAgent()
			cancel()
		}
	}
	return b.serveAgent(actx, ev.deadline, ev.received, req.Agent, target, kill, h.release, h.ended, h.taskEnded)
}
