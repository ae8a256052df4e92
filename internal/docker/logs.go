package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

// logQuery is what `docker logs` asks for.
type logQuery struct {
	stdout, stderr, follow, timestamps bool
	since, until                       time.Time
	tail                               int // -1: all
}

func parseLogQuery(r *http.Request) (logQuery, error) {
	q := r.URL.Query()
	lq := logQuery{tail: -1}
	for _, b := range []struct {
		name string
		to   *bool
	}{{"stdout", &lq.stdout}, {"stderr", &lq.stderr}, {"follow", &lq.follow}, {"timestamps", &lq.timestamps}} {
		if v := q.Get(b.name); v != "" {
			x, err := strconv.ParseBool(v)
			if err != nil {
				return lq, errdefs.InvalidArgument(b.name, "is not a boolean")
			}
			*b.to = x
		}
	}
	if !lq.stdout && !lq.stderr {
		return lq, errdefs.Errorf(errdefs.ErrInvalidArgument, "Bad parameters: you must choose at least one stream")
	}
	var err error
	if lq.since, err = parseTimestamp("since", q.Get("since")); err != nil {
		return lq, err
	}
	if lq.until, err = parseTimestamp("until", q.Get("until")); err != nil {
		return lq, err
	}
	if t := q.Get("tail"); t != "" && t != "all" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return lq, errdefs.InvalidArgument("tail", "must be a number of lines or all")
		}
		lq.tail = n
	}
	return lq, nil
}

// parseTimestamp reads the client's Unix time, "SECONDS[.NANOSECONDS]"; 0
// or empty is no bound.
func parseTimestamp(name, v string) (time.Time, error) {
	if v == "" || v == "0" {
		return time.Time{}, nil
	}
	sec, frac, _ := strings.Cut(v, ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	var ns int64
	if err == nil && frac != "" {
		if len(frac) > 9 {
			frac = frac[:9]
		}
		ns, err = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	if err != nil || s < 0 || s > math.MaxInt32*4 {
		return time.Time{}, errdefs.InvalidArgument(name, "must be a Unix timestamp, SECONDS[.NANOSECONDS]")
	}
	return time.Unix(s, ns), nil
}

// keep reports whether a record is output the query asks for.
func (lq logQuery) keep(rec *runlog.Record) bool {
	switch rec.Stream {
	case runlog.StreamStdout:
		if !lq.stdout {
			return false
		}
	case runlog.StreamStderr, runlog.StreamTruncated:
		if !lq.stderr {
			return false
		}
	default:
		return false
	}
	return (lq.since.IsZero() || !rec.Time.Before(lq.since)) && (lq.until.IsZero() || !rec.Time.After(lq.until))
}

// copyLog writes the container's output records from its Run's log to
// stdout and stderr, skipping the first skip that the query keeps; with
// follow, until the Run ended and its last records are out.
func (s *Server) copyLog(ctx context.Context, c *ctr, lq logQuery, follow bool, skip int, stdout, stderr io.Writer) (int, error) {
	st, err := s.cfg.Logs.OpenLog(ctx, c.run.Namespace, c.run.Name, follow)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	n := 0
	var line bytes.Buffer
	for {
		chunk, err := st.Next(ctx)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		for raw := range bytes.SplitSeq(chunk, []byte("\n")) {
			if len(raw) == 0 {
				continue
			}
			var rec runlog.Record
			if json.Unmarshal(raw, &rec) != nil || !lq.keep(&rec) {
				continue
			}
			if !lq.until.IsZero() && rec.Time.After(lq.until) {
				return n, nil
			}
			n++
			if n <= skip || stdout == nil {
				continue
			}
			line.Reset()
			if lq.timestamps {
				line.WriteString(rec.Time.UTC().Format(time.RFC3339Nano))
				line.WriteByte(' ')
			}
			line.WriteString(rec.Line)
			line.WriteByte('\n')
			out := stdout
			if rec.Stream != runlog.StreamStdout {
				out = stderr
			}
			if _, err := out.Write(line.Bytes()); err != nil {
				return n, err
			}
		}
	}
}

func (s *Server) containerLogs(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	lq, err := parseLogQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	skip := 0
	if c.run != nil && lq.tail >= 0 {
		total, err := s.copyLog(r.Context(), c, lq, false, 0, nil, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		skip = max(0, total-lq.tail)
	}
	// As Docker's: a TTY container's log is its terminal's one raw stream.
	w.Header().Set("Content-Type", streamType(c.meta.Tty))
	w.WriteHeader(http.StatusOK)
	if c.run == nil {
		return
	}
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	var stdout, stderr io.Writer = fw, io.Discard
	if !c.meta.Tty {
		stdout, stderr = newFramed(fw)
	}
	if _, err := s.copyLog(r.Context(), c, lq, lq.follow, skip, stdout, stderr); err != nil && r.Context().Err() == nil {
		s.log.Info("docker: logs ended early", "container", c.id[:12], "error", err)
	}
}

// flushWriter flushes each write: a log follower sees each line at once.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// serverCtx is the context of Run: streams past a hijack end with the
// server.
func (s *Server) serverCtx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}
