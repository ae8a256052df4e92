// Package logsummary bounds the server log under a flood of per-request
// events (an invocation refused with 429, a 503 while a pod is replaced):
// a Summariser writes at most one line per key per interval — the first
// event of a quiet key at once, the rest counted and summed up in the
// key's next line — so that the log grows with time, not with the request
// rate. It holds a bounded number of keys; events past that bound share
// one overflow key. The clock is injected; Flush writes the sums of keys
// that went quiet and forgets idle keys, and a timer calls it an interval
// after events were counted, until Close.
package logsummary

import (
	"context"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// OverflowKey is the key events take when MaxKeys keys are held.
const OverflowKey = "(other)"

// Defaults of Config.
const (
	DefaultInterval = 10 * time.Second
	DefaultMaxKeys  = 64
	// maxDetail cuts an event's detail (an error message) in a line.
	maxDetail = 256
)

// Config configures a Summariser.
type Config struct {
	Logger *slog.Logger
	// Level and Message are those of every line.
	Level   slog.Level
	Message string
	// KeyAttr names the key in a line (default "key").
	KeyAttr string
	// Interval is the least time between two lines of one key (default
	// DefaultInterval).
	Interval time.Duration
	// MaxKeys bounds the keys held (default DefaultMaxKeys).
	MaxKeys int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Summariser counts events by key and logs them at most once per key per
// interval. Safe for concurrent use.
type Summariser struct {
	cfg Config

	mu         sync.Mutex
	keys       map[string]*entry
	summarised uint64      // events counted into a later line rather than logged
	timer      *time.Timer // armed while events are pending
	closed     bool
}

type entry struct {
	logged  time.Time      // when the key's last line was written
	pending int            // events since then
	kinds   map[string]int // pending events by kind (e.g. HTTP status)
	detail  string         // the first pending event's detail
}

// New returns a Summariser.
func New(cfg Config) *Summariser {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KeyAttr == "" {
		cfg.KeyAttr = "key"
	}
	return &Summariser{cfg: cfg, keys: map[string]*entry{}}
}

// Record counts one event of key, of a kind (a few distinct values, e.g.
// an HTTP status) with a detail (e.g. the error; cut in the line). It
// writes a line at once when key had none within the interval, with the
// events counted since its last line.
func (s *Summariser) Record(key, kind, detail string) {
	now := s.cfg.Now()
	s.mu.Lock()
	e := s.keys[key]
	if e == nil {
		if len(s.keys) >= s.cfg.MaxKeys {
			key = OverflowKey
			e = s.keys[key]
		}
		if e == nil {
			e = &entry{kinds: map[string]int{}}
			s.keys[key] = e
		}
	}
	if e.pending == 0 {
		e.detail = detail
	}
	e.pending++
	if len(e.kinds) < 16 || e.kinds[kind] > 0 {
		e.kinds[kind]++
	} else {
		e.kinds["other"]++
	}
	if !e.logged.IsZero() && now.Sub(e.logged) < s.cfg.Interval {
		s.summarised++
		if s.timer == nil && !s.closed {
			s.timer = time.AfterFunc(s.cfg.Interval, s.onTimer)
		}
		s.mu.Unlock()
		return
	}
	attrs := s.takeLocked(key, e, now)
	s.mu.Unlock()
	s.cfg.Logger.LogAttrs(context.Background(), s.cfg.Level, s.cfg.Message, attrs...)
}

// takeLocked returns the line of e's pending events and resets them.
func (s *Summariser) takeLocked(key string, e *entry, now time.Time) []slog.Attr {
	kinds := make([]string, 0, len(e.kinds))
	for k, n := range e.kinds {
		kinds = append(kinds, k+":"+strconv.Itoa(n))
	}
	sort.Strings(kinds)
	attrs := []slog.Attr{slog.String(s.cfg.KeyAttr, key), slog.Int("count", e.pending),
		slog.String("by_kind", strings.Join(kinds, " ")), slog.String("first", cut(e.detail))}
	if !e.logged.IsZero() {
		attrs = append(attrs, slog.Duration("since_last_line", now.Sub(e.logged)))
	}
	e.logged, e.pending, e.detail = now, 0, ""
	clear(e.kinds)
	return attrs
}

// Flush writes the line of each key whose events are pending and whose
// interval has passed, and forgets keys quiet for a whole interval.
func (s *Summariser) Flush() {
	now := s.cfg.Now()
	var lines [][]slog.Attr
	s.mu.Lock()
	for key, e := range s.keys {
		if now.Sub(e.logged) < s.cfg.Interval {
			continue
		}
		if e.pending == 0 {
			delete(s.keys, key)
			continue
		}
		lines = append(lines, s.takeLocked(key, e, now))
	}
	s.mu.Unlock()
	for _, attrs := range lines {
		s.cfg.Logger.LogAttrs(context.Background(), s.cfg.Level, s.cfg.Message, attrs...)
	}
}

// Summarised returns how many events were counted into a later line
// rather than logged on their own (a metric).
func (s *Summariser) Summarised() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.summarised
}

// onTimer flushes, and arms the timer again while events are pending.
func (s *Summariser) onTimer() {
	s.Flush()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	if s.closed {
		return
	}
	for _, e := range s.keys {
		if e.pending > 0 {
			s.timer = time.AfterFunc(s.cfg.Interval, s.onTimer)
			return
		}
	}
}

// Close stops the timer and writes the lines that are due. Events
// recorded later are still counted and logged, with no timer.
func (s *Summariser) Close() {
	s.mu.Lock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.mu.Unlock()
	s.Flush()
}

// cut bounds a detail in a line.
func cut(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	i := maxDetail
	for i > 0 && s[i]&0xc0 == 0x80 { // not inside a UTF-8 sequence
		i--
	}
	return s[:i] + "…[truncated]"
}
