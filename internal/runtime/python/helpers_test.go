package python

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

var (
	interpreterOnce sync.Once
	interpreterPath string
	interpreterErr  error
)

// testInterpreter resolves python3 once for the whole test binary, as a
// server does at start-up.
func testInterpreter(tb testing.TB) string {
	tb.Helper()
	interpreterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		interpreterPath, interpreterErr = ResolveInterpreter(ctx, "")
	})
	if interpreterErr != nil {
		tb.Fatalf("python3 is required: %v", interpreterErr)
	}
	return interpreterPath
}

// writeHandlers writes files (slash-separated paths relative to the
// directory → contents) into a fresh temporary directory and returns it.
func writeHandlers(tb testing.TB, files map[string]string) string {
	tb.Helper()
	dir := tb.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// testSpec is the FunctionSpec the core would build for dir and handler,
// logging and filing its output to rec (nil: nowhere).
func testSpec(tb testing.TB, dir, handler string, rec *recorder, env map[string]string) runtime.FunctionSpec {
	tb.Helper()
	spec := runtime.FunctionSpec{
		RunUID:     "run-test",
		WorkingDir: dir,
		Handler:    handler,
		Env:        runtime.MergeEnv(runtime.BaseEnv(dir, tb.TempDir()), env),
		ScratchDir: tb.TempDir(),
		Logger:     slog.New(slog.DiscardHandler),
		Output:     runtime.DiscardOutput,
	}
	if rec != nil {
		spec.Logger, spec.Output = slog.New(rec.handler()).With("run_uid", "run-test"), rec
	}
	return spec
}

// loadHandler writes files, loads handler with a recording logger and
// closes the instance when the test ends.
func loadHandler(tb testing.TB, files map[string]string, handler string) (*instance, *recorder) {
	tb.Helper()
	rec := newRecorder()
	spec := testSpec(tb, writeHandlers(tb, files), handler, rec, nil)
	return loadSpec(tb, New(Config{Interpreter: testInterpreter(tb)}), spec), rec
}

func loadSpec(tb testing.TB, a *Adapter, spec runtime.FunctionSpec) *instance {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := a.Load(ctx, spec)
	if err != nil {
		tb.Fatalf("Load(%s): %v", spec.Handler, err)
	}
	tb.Cleanup(func() { _ = inst.Close() })
	return inst.(*instance)
}

// invoke runs one invocation with a 30 s timeout, like the core does.
func invoke(tb testing.TB, inst *instance, rec *recorder, id, input string) (runtime.Result, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return invokeCtx(ctx, inst, rec, id, input)
}

func invokeCtx(ctx context.Context, inst *instance, rec *recorder, id, input string) (runtime.Result, error) {
	deadline, _ := ctx.Deadline()
	res, err := inst.Invoke(ctx, runtime.Invocation{
		ID: id, RunUID: "run-test", Input: []byte(input), Deadline: deadline,
	})
	inst.Finish() // as the core does once the answer is sent
	return res, err
}

// logRecord is one captured log record with its attributes as strings.
type logRecord struct {
	Msg   string
	Attrs map[string]string
}

// recorder captures log records and can signal when a handler's output
// contains some text, so that tests synchronise on what the worker says.
type recorder struct {
	mu      sync.Mutex
	records []logRecord
	watches map[string]chan string
}

func newRecorder() *recorder { return &recorder{watches: map[string]chan string{}} }

func (r *recorder) handler() slog.Handler { return &recordHandler{r: r} }

// await returns a channel that receives the first output line containing
// substr, logged from now on.
func (r *recorder) await(substr string) <-chan string {
	ch := make(chan string, 1)
	r.mu.Lock()
	r.watches[substr] = ch
	r.mu.Unlock()
	return ch
}

func (r *recorder) add(rec logRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec)
	for substr, ch := range r.watches {
		if text, ok := rec.Attrs["line"]; ok && strings.Contains(text, substr) {
			ch <- text
			delete(r.watches, substr)
		}
	}
}

// Line implements runtime.Output: a line of the handler's output is kept
// as a record "output" with stream, line and invocation_id.
func (r *recorder) Line(stream, invocationID string, line []byte) {
	r.add(logRecord{Msg: "output", Attrs: map[string]string{"stream": stream, "line": string(line), "invocation_id": invocationID}})
}

// Flush implements runtime.Output.
func (r *recorder) Flush() {}

// output returns the handler-output records of one stream.
func (r *recorder) output(stream string) []logRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logRecord
	for _, rec := range r.records {
		if rec.Msg == "output" && rec.Attrs["stream"] == stream {
			out = append(out, rec)
		}
	}
	return out
}

type recordHandler struct {
	r     *recorder
	attrs []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, rec slog.Record) error {
	m := make(map[string]string, len(h.attrs)+rec.NumAttrs())
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	h.r.add(logRecord{Msg: rec.Message, Attrs: m})
	return nil
}

func (h *recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recordHandler{r: h.r, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *recordHandler) WithGroup(string) slog.Handler { return h }

// sysPidfdOpen is pidfd_open(2), the same number on amd64 and arm64.
const sysPidfdOpen = 434

// waitGone waits until process pid has exited (a zombie counts) or does not
// exist, through a pidfd, so that nothing polls.
func waitGone(tb testing.TB, pid int, within time.Duration) {
	tb.Helper()
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	switch errno {
	case 0:
	case syscall.ESRCH:
		return
	case syscall.ENOSYS, syscall.EPERM: // an old kernel, or a seccomp filter
		tb.Logf("pidfd_open unavailable (%v): not checking that %d is gone", errno, pid)
		return
	default:
		tb.Fatalf("pidfd_open(%d): %v", pid, errno)
	}
	defer syscall.Close(int(fd))
	tv := syscall.NsecToTimeval(within.Nanoseconds())
	for {
		var set syscall.FdSet
		set.Bits[fd/64] |= 1 << (fd % 64)
		n, err := syscall.Select(int(fd)+1, &set, nil, nil, &tv)
		if err == syscall.EINTR {
			continue // Linux has left the remaining time in tv
		}
		if err != nil {
			tb.Fatalf("select on pidfd of %d: %v", pid, err)
		}
		if n == 0 {
			tb.Fatalf("process %d is still running %s after it should have been killed", pid, within)
		}
		return
	}
}

// isClosed reports whether ch is closed right now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
