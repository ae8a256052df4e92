package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

// Log record streams, as the server writes them.
const (
	StreamStdout = runlog.StreamStdout
	StreamStderr = runlog.StreamStderr
	// StreamExit is the last record of a task attempt; it carries ExitCode.
	StreamExit = runlog.StreamExit
	// StreamTruncated is written once when the Run's log reached its bound.
	StreamTruncated = runlog.StreamTruncated
)

// LogRecord is one record of a Run's output (docs/http-api.md, "Logs"):
// the server's own record type, the wire type of GET .../logs.
type LogRecord = runlog.Record

// LogStream is an open log response. Next reads it in the caller's
// goroutine; Close ends it.
type LogStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	path string
}

// Logs opens the Run's log. With follow, the stream stays open and
// delivers new records until the Run is terminal and its last records are
// written.
func (c *Client) Logs(ctx context.Context, ns, name string, follow bool) (*LogStream, error) {
	var q url.Values
	if follow {
		q = url.Values{"follow": {"true"}}
	}
	u := c.url(q, runPath(ns, name, "logs")...)
	resp, err := c.send(ctx, request{method: http.MethodGet, url: u})
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 16<<10), MaxLogRecord)
	return &LogStream{body: resp.Body, sc: sc, path: u.Path}, nil
}

// Next returns the next record, or io.EOF at the end of the log.
func (s *LogStream) Next() (LogRecord, error) {
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var rec LogRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return LogRecord{}, fmt.Errorf("logs %s: decoding a record: %w", s.path, err)
		}
		return rec, nil
	}
	if err := s.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return LogRecord{}, errdefs.Errorf(errdefs.ErrTooLarge, "logs %s: a record exceeds %d bytes", s.path, MaxLogRecord)
		}
		return LogRecord{}, fmt.Errorf("logs %s: %w", s.path, err)
	}
	return LogRecord{}, io.EOF
}

// Close ends the stream.
func (s *LogStream) Close() error { return s.body.Close() }
