package logging

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
)

func TestOrDiscard(t *testing.T) {
	var buf bytes.Buffer
	given := slog.New(slog.NewTextHandler(&buf, nil))
	if OrDiscard(given) != given {
		t.Error("a given logger was replaced")
	}
	l := OrDiscard(nil)
	if l == nil || l.Enabled(context.Background(), slog.LevelError) {
		t.Errorf("OrDiscard(nil) = %v, want a logger that discards", l)
	}
}
