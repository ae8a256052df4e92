package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Each key appears once per line, whatever a logger's With chain and the
// call add, and durations read as Go durations.
func TestJSONHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewJSONHandler(&buf, slog.LevelInfo))
	pod := log.With("pod", "p1", "pod_uid", "u1")
	pod.With("pod", "p1-again").Info("started", "pod", "p1-third", "run_uid", "r", "run_uid", "r2",
		"took", 1500*time.Millisecond, "small", 250*time.Microsecond)
	pod.WithGroup("g").Info("grouped", "pod", "inner")
	log.Debug("not logged")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines %q", lines)
	}
	for _, want := range []string{
		`"msg":"started","pod":"p1","pod_uid":"u1","run_uid":"r","took":"1.5s","small":"250µs"}`,
		`"msg":"grouped","pod":"p1","pod_uid":"u1","g":{"pod":"inner"}}`,
	} {
		found := false
		for _, l := range lines {
			found = found || strings.HasSuffix(l, want)
		}
		if !found {
			t.Errorf("no line ends with %s in\n%s", want, buf.String())
		}
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("not JSON: %s", l)
		}
	}
}
