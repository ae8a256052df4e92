package logging

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"

	"stoke.dev/stoke/internal/bounds"
)

// NewJSONHandler is the process's one log handler: slog's JSON lines, with
// durations written as Go's duration strings ("1.5s", "250µs") rather
// than nanosecond integers, every attribute's value cut to bounds.Message
// bytes, and each key at most once per line — an attribute whose key a
// logger's With already set is dropped, so that a component adding what
// its caller added does not repeat it.
func NewJSONHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return &uniqueKeys{next: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr}), keys: map[string]bool{}}
}

// replaceAttr writes a duration as a duration string, and cuts a value —
// which may carry what a client sent: a path, an error quoting a body —
// with bounds.Echo, so that no log line is as large as a request. An error
// is written as its message, as slog writes one; any other value slog
// would write as JSON is written as JSON here, cut as text past the bound.
func replaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		return slog.String(a.Key, a.Value.Duration().String())
	case slog.KindString:
		if s := a.Value.String(); len(s) > bounds.Message {
			return slog.String(a.Key, bounds.Echo(s))
		}
	case slog.KindAny:
		v := a.Value.Any()
		if err, ok := v.(error); ok {
			return slog.String(a.Key, bounds.Echo(err.Error()))
		}
		b, err := json.Marshal(v)
		switch {
		case err != nil:
			// slog writes its own "!ERROR" text.
		case len(b) > bounds.Message:
			return slog.String(a.Key, bounds.Echo(string(b)))
		default:
			return slog.Any(a.Key, json.RawMessage(b))
		}
	}
	return a
}

// uniqueKeys drops attributes whose key is already on the line. keys are
// those of the current group set by WithAttrs; a handler is never changed
// once made, as slog requires.
type uniqueKeys struct {
	next slog.Handler
	keys map[string]bool
}

func (h *uniqueKeys) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	dup := false
	seen := map[string]bool{}
	r.Attrs(func(a slog.Attr) bool {
		if h.keys[a.Key] || seen[a.Key] {
			dup = true
			return false
		}
		seen[a.Key] = true
		return true
	})
	if !dup {
		return h.next.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	seen = map[string]bool{}
	r.Attrs(func(a slog.Attr) bool {
		if !h.keys[a.Key] && !seen[a.Key] {
			seen[a.Key] = true
			out.AddAttrs(a)
		}
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *uniqueKeys) WithAttrs(attrs []slog.Attr) slog.Handler {
	keys := make(map[string]bool, len(h.keys)+len(attrs))
	for k := range h.keys {
		keys[k] = true
	}
	kept := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if !keys[a.Key] {
			keys[a.Key] = true
			kept = append(kept, a)
		}
	}
	return &uniqueKeys{next: h.next.WithAttrs(kept), keys: keys}
}

func (h *uniqueKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	// Keys inside the group are the group's own.
	return &uniqueKeys{next: h.next.WithGroup(name), keys: map[string]bool{}}
}
