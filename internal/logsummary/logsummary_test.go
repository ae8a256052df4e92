package logsummary_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/internal/logsummary"
)

// clock is a fake clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type line struct {
	Key     string
	Count   int
	ByKind  string `json:"by_kind"`
	First   string
	Message string `json:"msg"`
}

func lines(t *testing.T, buf *bytes.Buffer) []line {
	t.Helper()
	var out []line
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var v line
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

func newSummariser(t *testing.T, buf *bytes.Buffer, clk *clock, maxKeys int) *logsummary.Summariser {
	s := logsummary.New(logsummary.Config{Logger: slog.New(slog.NewJSONHandler(buf, nil)), Message: "refused",
		Interval: time.Minute, MaxKeys: maxKeys, Now: clk.Now})
	t.Cleanup(s.Close)
	return s
}

// The first event of a key is logged at once; the rest of its interval is
// counted into the key's next line, which comes with the next event after
// the interval or with Flush.
func TestOneLinePerKeyPerInterval(t *testing.T) {
	var buf bytes.Buffer
	clk := &clock{now: time.Unix(1000, 0)}
	s := newSummariser(t, &buf, clk, 8)
	for i := range 10000 {
		s.Record("default/fn", "429", fmt.Sprintf("in flight %d", i))
		if i%1000 == 0 {
			clk.Advance(time.Second) // 10 s over the whole flood
		}
	}
	got := lines(t, &buf)
	if len(got) != 1 || got[0].Count != 1 || got[0].First != "in flight 0" {
		t.Fatalf("lines %+v, want one for the first event", got)
	}
	s.Flush() // not due yet
	if got := lines(t, &buf); len(got) != 1 {
		t.Fatalf("a flush within the interval wrote %+v", got[1:])
	}
	clk.Advance(time.Minute)
	s.Flush()
	got = lines(t, &buf)
	if len(got) != 2 || got[1].Count != 9999 || got[1].ByKind != "429:9999" || got[1].First != "in flight 1" {
		t.Fatalf("lines %+v, want the sum of the 9999 others", got)
	}
	if n := s.Summarised(); n != 9999 {
		t.Errorf("Summarised = %d, want 9999", n)
	}
	if buf.Len() > 1024 {
		t.Errorf("10000 events wrote %d bytes of log", buf.Len())
	}
	// A quiet key is forgotten; its next event is logged at once.
	clk.Advance(time.Minute)
	s.Flush()
	s.Record("default/fn", "503", "gone")
	if got := lines(t, &buf); len(got) != 3 || got[2].Count != 1 || got[2].ByKind != "503:1" {
		t.Fatalf("lines %+v", got)
	}
}

// Keys past MaxKeys share one overflow key, so that the lines per
// interval stay at most MaxKeys+1 whatever the keys.
func TestKeysAreBounded(t *testing.T) {
	var buf bytes.Buffer
	clk := &clock{now: time.Unix(1000, 0)}
	s := newSummariser(t, &buf, clk, 4)
	for i := range 1000 {
		s.Record(fmt.Sprintf("default/fn-%d", i), "429", strings.Repeat("é", 1000))
	}
	got := lines(t, &buf)
	if len(got) != 5 || got[4].Key != logsummary.OverflowKey {
		t.Fatalf("%d lines, want 4 keys and the overflow: %+v", len(got), got)
	}
	for _, l := range got {
		if len(l.First) > 300 || !strings.HasSuffix(l.First, "…[truncated]") {
			t.Errorf("detail of %d bytes: %q", len(l.First), l.First)
		}
	}
	clk.Advance(time.Minute)
	s.Flush()
	if got := lines(t, &buf); len(got) != 6 || got[5].Key != logsummary.OverflowKey || got[5].Count != 995 {
		t.Fatalf("after the interval: %+v", got[5:])
	}
}
