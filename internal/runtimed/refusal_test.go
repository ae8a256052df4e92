package runtimed_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"stoke.dev/stoke/internal/syncbuf"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// refusingRuns answers runtimed's first status writes with the refusals
// it holds, in order — the categories the Kubernetes store gives a 403
// and a 401 — and passes the rest to the real store.
type refusingRuns struct {
	store.Resource[*v1alpha1.Run]
	mu       sync.Mutex
	refusals []error
}

func (r *refusingRuns) UpdateStatus(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	r.mu.Lock()
	if len(r.refusals) > 0 {
		err := r.refusals[0]
		r.refusals = r.refusals[1:]
		r.mu.Unlock()
		return nil, fmt.Errorf("run %s/%s: update status: refused by the test: %w", run.Namespace, run.Name, err)
	}
	r.mu.Unlock()
	return r.Resource.UpdateStatus(ctx, run)
}

// records parses a JSON log.
func records(t *testing.T, log *syncbuf.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(log.Bytes()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out
}

// A status write the store refuses (401, 403) is tried again, as when an
// API server has just started; the refusal is logged, with the resource
// and the error, when it begins and when it changes, and its end once —
// not on every attempt, and not in silence.
func TestStoreRefusalsAreLogged(t *testing.T) {
	var logs syncbuf.Buffer
	refusals := []error{errdefs.ErrPermissionDenied, errdefs.ErrPermissionDenied, errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated}
	e := newEnvWith(t, "bash", envOptions{
		runs: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			return &refusingRuns{Resource: r, refusals: refusals}
		},
		log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	e.submit(taskRun("refused", "true"))
	if run := e.waitPhase("refused", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); run.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("status %+v", run.Status)
	}

	var refused, ended []map[string]any
	for _, rec := range records(t, &logs) {
		msg, _ := rec["msg"].(string)
		switch {
		case strings.HasPrefix(msg, "the store refuses runtimed's write"):
			refused = append(refused, rec)
		case strings.HasPrefix(msg, "the store no longer refuses"):
			ended = append(ended, rec)
		}
	}
	if len(refused) != 2 || len(ended) != 1 {
		t.Fatalf("%d refusal and %d end records, want 2 (403, then 401) and 1:\n%s", len(refused), len(ended), logs.String())
	}
	for i, want := range []error{errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated} {
		rec := refused[i]
		msg, _ := rec["error"].(string)
		if rec["level"] != "ERROR" || rec["resource"] != "runs/status" || !strings.Contains(msg, "default/refused") || !strings.Contains(msg, want.Error()) {
			t.Errorf("refusal record %d: %v, want level ERROR, resource runs/status and an error naming the Run and %q", i, rec, want)
		}
	}
	if ended[0]["level"] != "INFO" || ended[0]["resource"] != "runs/status" {
		t.Errorf("end record: %v", ended[0])
	}
}
