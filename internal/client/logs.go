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
	u := c.url(q, c.dataplanePath(ns, name, "logs", "")...)
	resp, err := c.send(ctx, request{method: http.MethodGet, url: u})
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 16<<10), MaxLogRecord)
	return &LogStream{body: resp.Body, sc: sc, path: u.Path}, nil
}

// Next returns the next record, or io.EOF at the end of the log.
func (s *LogStream) Next() (runlog.Record, error) {
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var rec runlog.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return runlog.Record{}, fmt.Errorf("logs %s: decoding a record: %w", s.path, err)
		}
		return rec, nil
	}
	if err := s.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return runlog.Record{}, errdefs.Errorf(errdefs.ErrTooLarge, "logs %s: a record exceeds %d bytes", s.path, MaxLogRecord)
		}
		return runlog.Record{}, fmt.Errorf("logs %s: %w", s.path, err)
	}
	return runlog.Record{}, io.EOF
}

// Close ends the stream.
func (s *LogStream) Close() error { return s.body.Close() }
