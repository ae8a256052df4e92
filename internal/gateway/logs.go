package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
)

// LogReader opens a Run's log: standalone reads its own directory
// (storeLogReader), Kubernetes mode the Run's pod through runtimed. Its
// errors carry errdefs categories (NotFound: no such Run; Expired: the
// log went with its pod).
type LogReader interface {
	// OpenLog opens the log of the Run namespace/name from its start.
	// With follow, the stream goes on until the Run is terminal (or
	// deleted) and its last records are out.
	OpenLog(ctx context.Context, namespace, name string, follow bool) (LogStream, error)
}

// LogStream is an open Run log.
type LogStream interface {
	// Next returns the next whole JSON lines (at most about 64 KiB), and
	// io.EOF at the end; a follower's Next waits for more.
	Next(ctx context.Context) ([]byte, error)
	Close() error
}

// logChunk bounds one read of a log.
const logChunk = 64 << 10

// logs streams a Run's output records as JSON lines; ?follow=true keeps
// streaming until the Run is terminal and its last records are out.
func (g *Gateway) logs(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ns, name := r.PathValue("ns"), r.PathValue("name")
	follow, err := logsQueryOf(r)
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	if follow {
		release, ok := g.openStream(w)
		if !ok {
			return
		}
		defer release()
	}
	st, err := g.cfg.Logs.OpenLog(ctx, ns, name, follow)
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	defer st.Close()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for {
		chunk, err := st.Next(ctx)
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				g.log.Warn("reading a run log", "run", ns+"/"+name, "error", err)
			}
			return
		}
		g.nextWrite(rc)
		if _, err := w.Write(chunk); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}
