package docker

import (
	"context"
	"net/http"
	"time"

	"github.com/moby/moby/api/types/container"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

type condition string

const (
	conditionNotRunning = condition(container.WaitConditionNotRunning)
	conditionNextExit   = condition(container.WaitConditionNextExit)
	conditionRemoved    = condition(container.WaitConditionRemoved)
)

// waitRecheck bounds how long a waiter goes without looking, should a
// Run event be missed while the watch is restarted.
const waitRecheck = time.Second

// waitFor waits until the container meets cond and returns its exit
// status: not-running (created or exited), next-exit (its Run ended; one
// that ended already counts, since the client may ask after a fast task
// ended) or removed (its Run is deleted).
func (s *Server) waitFor(ctx context.Context, c *ctr, cond condition) (int, error) {
	last := c
	tick := time.NewTicker(waitRecheck)
	defer tick.Stop()
	for {
		ch := s.changes()
		cur, err := s.lookup(c.id)
		if err != nil {
			// Gone: every condition is met. It may have ended and
			// gone between two looks: its die event says how.
			if code, ok := s.events.exitOf(c.id); ok {
				return code, nil
			}
			return last.exitCode(), nil
		}
		last = cur
		switch cond {
		case conditionNotRunning:
			if !cur.running() {
				return cur.exitCode(), nil
			}
		case conditionNextExit:
			if cur.run != nil && cur.run.Status.Phase.Terminal() {
				return cur.exitCode(), nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ch:
		case <-tick.C:
		}
	}
}

func (s *Server) containerWait(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	cond := condition(r.URL.Query().Get("condition"))
	switch cond {
	case "":
		cond = conditionNotRunning
	case conditionNotRunning, conditionNextExit, conditionRemoved:
	default:
		writeError(w, errdefs.InvalidArgument("condition", "invalid condition: %q", bounds.Truncate(string(cond), bounds.Quoted)))
		return
	}
	// The header goes at once: the client knows the wait is in place
	// before it starts the container.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	code, err := s.waitFor(r.Context(), c, cond)
	resp := container.WaitResponse{StatusCode: int64(code)}
	if err != nil {
		resp.Error = &container.WaitExitError{Message: err.Error()}
	}
	writeJSONLine(w, resp)
}

// autoRemove deletes an AutoRemove container's Run once it has ended and no
// attach stream reads it.
func (s *Server) autoRemove(ctx context.Context, run *v1alpha1.Run) {
	if run == nil || !run.Status.Phase.Terminal() || run.Spec.Mode.Task == nil {
		return
	}
	c := s.fromRun(run)
	if !c.meta.AutoRemove {
		return
	}
	s.mu.Lock()
	_, mine := s.started[c.id]
	busy := s.attached[c.id] > 0 || (s.cfg.Replicated && !mine)
	s.mu.Unlock()
	if busy {
		return
	}
	if _, err := s.cfg.Backend.DeleteRun(ctx, run.Namespace, run.Name); err != nil && errdefs.HTTPStatus(err) != http.StatusNotFound {
		s.log.Warn("docker: removing an AutoRemove container", "run_uid", run.UID, "error", err)
	}
}
