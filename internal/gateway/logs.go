package gateway

import (
	"net/http"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// logChunk bounds one read of a log file.
const logChunk = 64 << 10

// logs streams a Run's output records as JSON lines; ?follow=true keeps
// streaming until the Run is terminal and its last records are out.
func (g *Gateway) logs(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ns, name := r.PathValue("ns"), r.PathValue("name")
	follow := r.URL.Query().Get("follow") == "true"
	if follow {
		release, ok := g.openStream(w)
		if !ok {
			return
		}
		defer release()
	}
	run, err := g.cfg.API.GetRun(ctx, ns, name)
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	uid := run.UID
	logs := g.cfg.API.Logs()
	rd, err := logs.Open(string(uid))
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	defer rd.Close()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var poll *time.Ticker
	for {
		changed := logs.Changed() // before reading, so no write is missed
		// The Runtime Server writes a Run's output, and a task attempt's
		// exit record, before it reports the end: once the Run is seen
		// terminal (or gone), the read that follows is the last.
		last := !follow || run == nil || run.UID != uid || run.Status.Phase.Terminal()
		for {
			chunk, err := rd.Next(logChunk)
			if err != nil {
				g.log.Warn("reading a run log", "run_uid", uid, "error", err)
				return
			}
			if chunk == nil {
				break
			}
			g.nextWrite(rc)
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		g.nextWrite(rc)
		if last || rc.Flush() != nil {
			return
		}
		if poll == nil {
			poll = time.NewTicker(g.cfg.LogFollowPoll)
			defer poll.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-poll.C:
		}
		if run, err = g.currentRun(r, ns, name); err != nil {
			run = nil // deleted
		}
	}
}

// currentRun reads a followed Run from memory, or from the store while
// memory has not caught up with its creation.
func (g *Gateway) currentRun(r *http.Request, ns, name string) (*v1alpha1.Run, error) {
	if run, ok := g.cfg.API.CachedRun(ns, name); ok {
		return run, nil
	}
	return g.cfg.API.GetRun(r.Context(), ns, name)
}
