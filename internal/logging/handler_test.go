package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
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

// A value that may carry what a client sent — a string, an error quoting
// a body, anything written as JSON — is cut to bounds.Message bytes, so
// that no line is as large as a request; small values are written as
// before.
func TestJSONHandlerBoundsValues(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewJSONHandler(&buf, slog.LevelInfo))
	huge := strings.Repeat("x", 3<<20)
	log.With("with", huge).Info("api", "path", "/v1/"+huge, "error", errors.New("label: "+huge),
		"args", []string{huge}, "phase", v1alpha1.PhaseRunning, "n", 3, "ok", true, "list", []string{"a"})
	line := buf.String()
	if len(line) > 6*bounds.Message {
		t.Fatalf("a line of %d bytes", len(line))
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	for _, k := range []string{"with", "path", "error", "args"} {
		s, ok := rec[k].(string)
		if !ok || len(s) > bounds.Message || !strings.HasSuffix(s, "…[truncated]") {
			t.Errorf("%s: %T of %d bytes, want a cut string", k, rec[k], len(s))
		}
	}
	if rec["phase"] != "Running" || rec["n"] != 3.0 || rec["ok"] != true || fmt.Sprint(rec["list"]) != "[a]" {
		t.Errorf("small values changed: %v %v %v %v", rec["phase"], rec["n"], rec["ok"], rec["list"])
	}
}
