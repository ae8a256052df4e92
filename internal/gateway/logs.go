package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runlog"
)

// lastRecordsGrace is how long a follower of a terminal Run waits for the
// last records of its output, which reach the log through the pod's log
// pipe and may trail the status write. A task's exit record ends the wait
// at once.
const lastRecordsGrace = 2 * time.Second

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
	var exited int32 // the highest attempt with an exit record
	var poll *time.Ticker
	var terminalSince time.Time
	for {
		changed := logs.Changed() // before reading, so no write is missed
		for {
			chunk, err := rd.Next(logChunk)
			if err != nil {
				g.log.Warn("reading a run log", "run_uid", uid, "error", err)
				return
			}
			if chunk == nil {
				break
			}
			exited = max(exited, lastExit(chunk))
			g.nextWrite(rc)
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		g.nextWrite(rc)
		if !follow || rc.Flush() != nil {
			return
		}
		if run, err = g.currentRun(r, ns, name); err != nil || run.UID != uid {
			return // deleted, or replaced by another Run of that name
		}
		if run.Status.Phase.Terminal() {
			if terminalSince.IsZero() {
				terminalSince = time.Now()
			}
			isTask := run.Spec.Mode.Task != nil
			started := run.Status.AssignedPod != "" || run.Status.StartTime != nil
			if !isTask || !started || exited >= run.Status.Attempt || time.Since(terminalSince) > lastRecordsGrace {
				return
			}
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

// lastExit returns the highest attempt of the exit records in chunk.
func lastExit(chunk []byte) int32 {
	var attempt int32
	for line := range bytes.Lines(chunk) {
		if !bytes.Contains(line, []byte(`"stream":"exit"`)) {
			continue
		}
		var rec runlog.Record
		if json.Unmarshal(line, &rec) == nil && rec.Stream == runlog.StreamExit {
			attempt = max(attempt, rec.Attempt)
		}
	}
	return attempt
}
