package bash

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

// recorder is a slog.Handler and a runtime.Output that keeps every record
// and every line of output, for assertions on what was logged and filed.
type recorder struct {
	mu      *sync.Mutex
	records *[]logRecord
	waiters *[]waiter
	attrs   []slog.Attr
}

// waiter is closed once a record whose "line" contains substr is logged.
type waiter struct {
	substr string
	ch     chan struct{}
}

type logRecord struct {
	msg   string
	attrs map[string]string
}

func newRecorder() *recorder {
	return &recorder{mu: &sync.Mutex{}, records: &[]logRecord{}, waiters: &[]waiter{}}
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	lr := logRecord{msg: rec.Message, attrs: map[string]string{}}
	for _, a := range r.attrs {
		lr.attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		lr.attrs[a.Key] = a.Value.String()
		return true
	})
	r.add(lr)
	return nil
}

// Line implements runtime.Output: a line of the handler's output is kept
// as a record "output" with stream, line and invocation_id.
func (r *recorder) Line(stream, invocationID string, line []byte) {
	r.add(logRecord{msg: "output", attrs: map[string]string{"stream": stream, "line": string(line), "invocation_id": invocationID}})
}

// Flush implements runtime.Output.
func (r *recorder) Flush() {}

func (r *recorder) add(lr logRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.records = append(*r.records, lr)
	ws := (*r.waiters)[:0]
	for _, w := range *r.waiters {
		if strings.Contains(lr.attrs["line"], w.substr) {
			close(w.ch)
		} else {
			ws = append(ws, w)
		}
	}
	*r.waiters = ws
}

// waitFor returns a channel closed once a line containing substr is logged.
func (r *recorder) waitFor(substr string) <-chan struct{} {
	w := waiter{substr: substr, ch: make(chan struct{})}
	r.mu.Lock()
	*r.waiters = append(*r.waiters, w)
	r.mu.Unlock()
	return w.ch
}

func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr(nil), r.attrs...), as...)
	return &c
}

func (r *recorder) WithGroup(string) slog.Handler { return r }

// stderrLines returns the logged stderr lines, each with its invocation ID.
func (r *recorder) stderrLines() []logRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logRecord
	for _, lr := range *r.records {
		if lr.msg == "output" {
			out = append(out, lr)
		}
	}
	return out
}

// fixture is a working directory with handler files, ready to Load.
type fixture struct {
	t    testing.TB
	dir  string
	spec runtime.FunctionSpec
	rec  *recorder
	log  *slog.Logger
	n    atomic.Int64 // invocations so far, for their IDs
}

func newFixture(t *testing.T, files map[string]string) *fixture {
	return newFixtureTB(t, files)
}

func newFixtureTB(t testing.TB, files map[string]string) *fixture {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wd := filepath.Join(root, "wd")
	scratch := filepath.Join(root, "ipc")
	tmp := filepath.Join(root, "tmp")
	for _, d := range []string{wd, scratch, tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range files {
		p := filepath.Join(wd, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rec := newRecorder()
	log := slog.New(rec).With("run_uid", "uid-1")
	return &fixture{t: t, dir: wd, rec: rec, log: log, spec: runtime.FunctionSpec{
		RunUID:     "uid-1",
		WorkingDir: wd,
		Env:        runtime.MergeEnv(runtime.BaseEnv(wd, tmp), map[string]string{"GREETING": "hello"}),
		ScratchDir: scratch,
		Logger:     log,
		Output:     rec,
	}}
}

func (f *fixture) load(handler string) (*instance, error) {
	f.t.Helper()
	spec := f.spec
	spec.Handler = handler
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := New(Config{}).Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	f.t.Cleanup(func() { _ = inst.Close() })
	return inst.(*instance), nil
}

func (f *fixture) mustLoad(handler string) *instance {
	f.t.Helper()
	in, err := f.load(handler)
	if err != nil {
		f.t.Fatalf("Load(%s): %v", handler, err)
	}
	return in
}

// invoke invokes in with a fresh invocation ID and the given timeout.
func (f *fixture) invoke(in *instance, input string, timeout time.Duration) (runtime.Result, error) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	id := "inv-" + strconv.FormatInt(f.n.Add(1), 10)
	return in.Invoke(ctx, runtime.Invocation{ID: id, RunUID: "uid-1", Input: []byte(input)})
}
