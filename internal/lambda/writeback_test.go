package lambda_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// writeBackLimit is the write-back bound of these tests' server.
const writeBackLimit = 1 << 20

// startWriteBack is a bash Lambda Runtime Server whose write-backs are
// bounded by writeBackLimit.
func startWriteBack(t testing.TB, observe func(string, time.Duration)) env {
	t.Helper()
	e, _, _ := startWriteBackCounting(t, observe, writeBackLimit)
	return e
}

// wroteBack keeps the last write-back of each workspace, as the Runtime
// Server reports it.
type wroteBack struct {
	mu   sync.Mutex
	last map[string]lambda.WriteBack // by the workspace's directory name
}

func (w *wroteBack) of(ws string) (lambda.WriteBack, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wb, ok := w.last[ws]
	return wb, ok
}

// startWriteBackCounting is startWriteBack bounded by limit that also
// hears what each write-back did.
func startWriteBackCounting(t testing.TB, observe func(string, time.Duration), limit int64) (env, *wroteBack, *lambda.Server) {
	t.Helper()
	w := &wroteBack{last: map[string]lambda.WriteBack{}}
	sim := simulator(t)
	srv := newServerWith(t, sim, "bash", func(c *lambda.Config) {
		c.WriteBackBytes, c.Observe = limit, observe
		c.WroteBack = func(wb lambda.WriteBack) {
			w.mu.Lock()
			w.last[wb.RunUID] = wb
			w.mu.Unlock()
		}
	})
	rs := runtimetest.StartServer(t, runtimetest.Harness{
		Runtime:  "lambda",
		Fixtures: func(runtimetest.Fixture) runtimetest.Source { return runtimetest.Source{} },
	}, func(c *server.Config) { serve(c, srv) })
	return env{sim: sim, rs: rs}, w, srv
}

// sharedWorkspace makes a job's shared workspace (runtimed's "ws-NAME")
// in e's workspace root, holding files.
func sharedWorkspace(t testing.TB, e env, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(e.rs.Workspace, "ws-"+name)
	for n, content := range files {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// step runs one task in dir and returns its end.
func step(t testing.TB, e env, id, dir, script string, env map[string]string) *pb.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The step's script is a file of the workspace, as a checked-out
	// script would be.
	entry := ".steps/" + id + ".sh"
	if err := os.MkdirAll(filepath.Join(dir, ".steps"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, entry), []byte(script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: id, WorkingDir: dir, Entrypoint: entry, Env: env}); err != nil {
		t.Fatal(err)
	}
	st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestStepsOfASharedWorkspaceAreWrittenBack: each step of a job on Lambda
// is an invocation of its own; what one writes in its sandbox is copied
// back into the job's workspace, so the next step (another invocation,
// another function: the package changed) reads and changes it, and the
// workspace on the Runtime Server's machine ends with both steps' work.
// The package's bootstrap is not written back.
func TestStepsOfASharedWorkspaceAreWrittenBack(t *testing.T) {
	e := startWriteBack(t, nil)
	dir := sharedWorkspace(t, e, "build", map[string]string{"src/main.txt": "source\n"})
	st := step(t, e, "step-1", dir, "set -e; mkdir -p dist; cat src/main.txt > dist/out.txt; echo one >> dist/out.txt", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
		t.Fatalf("step 1: %v exit %d stderr %q (%s)", st.GetState(), st.GetExitCode(), st.GetStderr(), st.GetErrorMessage())
	}
	st = step(t, e, "step-2", dir, "set -e; cat dist/out.txt; echo two >> dist/out.txt", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || st.GetStdout() != "source\none\n" {
		t.Fatalf("step 2: %v exit %d stdout %q stderr %q; want it to read step 1's file", st.GetState(), st.GetExitCode(), st.GetStdout(), st.GetStderr())
	}
	got, err := os.ReadFile(filepath.Join(dir, "dist", "out.txt"))
	if err != nil || string(got) != "source\none\ntwo\n" {
		t.Fatalf("the workspace's dist/out.txt: %q (%v); want both steps' lines", got, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "bootstrap")); !os.IsNotExist(err) {
		t.Fatalf("the package's bootstrap was written back into the workspace (%v)", err)
	}
}

// TestWriteBackRefusesEscapesAndOverBound: the sandbox is the step's to
// do as it likes with, so what comes back is checked. A tar with a ../
// entry (the step's own tar, first on its PATH), a link leaving the
// workspace, and more than the bound each fail the step, saying why,
// and nothing is written outside the workspace.
func TestWriteBackRefusesEscapesAndOverBound(t *testing.T) {
	e := startWriteBack(t, nil)
	outside := filepath.Dir(e.rs.Workspace)
	fakeTar := `mkdir -p bin; cat > bin/tar <<'EOF'
#!/bin/sh
exec python3 -c 'import io, sys, tarfile
t = tarfile.open(fileobj=sys.stdout.buffer, mode="w|")
i = tarfile.TarInfo("../escaped"); i.size = 3
t.addfile(i, io.BytesIO(b"bad")); t.close()'
EOF
chmod +x bin/tar`
	for _, tc := range []struct {
		name, script string
		env          map[string]string
		want         string
	}{
		{"dotdot", fakeTar, map[string]string{"PATH": "bin:/usr/local/bin:/usr/bin:/bin"}, "escaped"},
		{"symlink", "ln -s " + outside + " evil", nil, "evil"},
		{"over-bound", "head -c 2000000 /dev/zero > big.bin", nil, "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := sharedWorkspace(t, e, tc.name, map[string]string{"keep.txt": "kept\n"})
			st := step(t, e, "bad-"+tc.name, dir, tc.script, tc.env)
			if st.GetState() == pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || !strings.Contains(st.GetStderr(), "writing the sandbox's workspace back") ||
				!strings.Contains(st.GetStderr(), tc.want) {
				t.Fatalf("step: %v exit %d stderr %q; want it failed, naming the write-back and %q", st.GetState(), st.GetExitCode(), st.GetStderr(), tc.want)
			}
			if _, err := os.Lstat(filepath.Join(e.rs.Workspace, "escaped")); !os.IsNotExist(err) {
				t.Fatalf("a file was written outside the workspace (%v)", err)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "keep.txt")); err != nil || string(got) != "kept\n" {
				t.Fatalf("keep.txt: %q (%v)", got, err)
			}
		})
	}
}

// BenchmarkTaskWriteBack: what the write-back costs a step. The same step
// (it writes a file of 64 KiB) in a workspace of writeBackBenchFiles
// files of 16 KiB (a small checkout), three ways, in turn: in a Run's own
// directory, which is not written back (the peer); in a job's shared
// workspace, written back as the bootstrap lists it (the new file alone);
// and in another, whose whole directory is copied back, as before the
// bootstrap listed its changes. p50 of each from the Runtime service's
// Execute to its Wait's answer, and of each write-back alone (the
// TaskEnded event to the release).
func BenchmarkTaskWriteBack(b *testing.B) {
	var mu sync.Mutex
	var copies []time.Duration
	e, w, srv := startWriteBackCounting(b, func(what string, d time.Duration) {
		if what == "write-back" {
			mu.Lock()
			copies = append(copies, d)
			mu.Unlock()
		}
	}, bounds.ArtifactBytes)
	files := map[string]string{}
	for i := range writeBackBenchFiles {
		files[fmt.Sprintf("src/f%03d.txt", i)] = strings.Repeat(fmt.Sprintf("%07d\n", i), 2048)
	}
	const script = "head -c 65536 /dev/zero > out.bin"
	var plain, listed, whole, listedCopy, wholeCopy []time.Duration
	for i := range b.N {
		for _, way := range []string{"plain", "listed", "whole"} {
			dir := e.rs.Dir(b, runtimetest.Source{Files: files})
			if way != "plain" {
				dir = sharedWorkspace(b, e, fmt.Sprintf("bench-%d-%s", i, way), files)
			}
			srv.CopyWholeDirectories(way == "whole")
			mu.Lock()
			copies = copies[:0]
			mu.Unlock()
			start := time.Now()
			st := step(b, e, fmt.Sprintf("bench-%d-%s", i, way), dir, script, nil)
			took := time.Since(start)
			if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
				b.Fatalf("step: %v %q", st.GetState(), st.GetStderr())
			}
			mu.Lock()
			var copied []time.Duration
			copied = append(copied, copies...)
			mu.Unlock()
			switch way {
			case "plain":
				plain = append(plain, took)
			case "listed":
				listed, listedCopy = append(listed, took), append(listedCopy, copied...)
				if wb, _ := w.of(filepath.Base(dir)); wb.Whole || wb.Sent != 1 {
					b.Fatalf("write-back %+v; want out.bin alone", wb)
				}
			case "whole":
				whole, wholeCopy = append(whole, took), append(wholeCopy, copied...)
				if wb, _ := w.of(filepath.Base(dir)); !wb.Whole || wb.Sent < writeBackBenchFiles {
					b.Fatalf("write-back %+v; want the whole directory", wb)
				}
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(p50ms(plain), "step-p50-ms")
	b.ReportMetric(p50ms(listed), "step-written-back-p50-ms")
	b.ReportMetric(p50ms(whole), "step-whole-copy-p50-ms")
	b.ReportMetric(p50ms(listedCopy), "write-back-p50-ms")
	b.ReportMetric(p50ms(wholeCopy), "whole-copy-p50-ms")
}

// writeBackBenchFiles is how many files BenchmarkTaskWriteBack's
// workspace holds.
const writeBackBenchFiles = 200

// TestCancelledStepIsNotWrittenBack: a step cancelled (or timed out)
// mid-run is not written back: the job's next step, an if: always() one,
// may be running in the workspace by then. Its invocation is released
// all the same, and ends with the bootstrap's answer.
func TestCancelledStepIsNotWrittenBack(t *testing.T) {
	e := startWriteBack(t, nil)
	dir := sharedWorkspace(t, e, "cancelled", map[string]string{"task.sh": "echo partial > partial.txt\nsleep 600\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	mark := fmt.Sprintf("TASK_MARK=%d", time.Now().UnixNano())
	k, v, _ := strings.Cut(mark, "=")
	if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "cancelled", WorkingDir: dir, Entrypoint: "task.sh",
		Env: map[string]string{k: v}, TimeoutSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	awaitSandbox(t, mark, 1)
	if _, err := e.rs.Runtime.Cancel(ctx, &pb.CancelRequest{Id: "cancelled"}); err != nil {
		t.Fatal(err)
	}
	ended, err := e.sim.AwaitEnded(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ended[0].ErrorType != "" {
		t.Fatalf("the step's invocation ended with %s; want the bootstrap's answer after its release", ended[0].ErrorType)
	}
	if _, err := os.Stat(filepath.Join(dir, "partial.txt")); !os.IsNotExist(err) {
		t.Fatalf("the cancelled step's partial.txt was written back (%v)", err)
	}
}

// TestWhatAStepRemovesIsRemoved: a step that removes a directory and a
// file (`rm -rf build/`, then a check, as CI steps do) has them removed
// from the job's workspace, so the next step (another invocation) does
// not see them; what it did not touch stays, and is not copied back. A
// step that fails by itself is written back all the same, removals
// included. A step that turns a file into a directory has the file
// replaced.
func TestWhatAStepRemovesIsRemoved(t *testing.T) {
	e, w, _ := startWriteBackCounting(t, nil, writeBackLimit)
	dir := sharedWorkspace(t, e, "removes", map[string]string{
		"build/a.o": "a", "build/sub/b.o": "b", "old.txt": "old\n", "keep.txt": "kept\n", "was-a-file": "f\n",
	})
	st := step(t, e, "remove-1", dir, "set -e; rm -rf build; rm old.txt; rm was-a-file; mkdir -p was-a-file/now; echo dir > was-a-file/now/x", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
		t.Fatalf("step 1: %v exit %d stderr %q (%s)", st.GetState(), st.GetExitCode(), st.GetStderr(), st.GetErrorMessage())
	}
	for _, gone := range []string{"build", "old.txt"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Fatalf("%s is still in the workspace after the step removed it (%v)", gone, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "was-a-file", "now", "x")); err != nil || string(got) != "dir\n" {
		t.Fatalf("was-a-file/now/x: %q (%v); want the step's directory in place of the file", got, err)
	}
	// build and old.txt removed, was-a-file replaced; the new directory
	// and its two entries sent; keep.txt and the step's script (and its
	// directory) left alone.
	if wb, ok := w.of("ws-removes"); !ok || wb.Whole || wb.Deleted != 3 || wb.Sent != 3 || wb.Unchanged != 3 {
		t.Fatalf("write-back %+v (reported %v); want 3 removed (build, old.txt, was-a-file), 3 sent, 3 unchanged", wb, ok)
	}
	st = step(t, e, "remove-2", dir, "set -e; test ! -e build; test ! -e old.txt; cat keep.txt; rm keep.txt; echo partial > partial.txt; exit 3", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_FAILED || st.GetExitCode() != 3 || st.GetStdout() != "kept\n" {
		t.Fatalf("step 2: %v exit %d stdout %q stderr %q; want exit 3 after it saw build and old.txt gone", st.GetState(), st.GetExitCode(), st.GetStdout(), st.GetStderr())
	}
	if _, err := os.Lstat(filepath.Join(dir, "keep.txt")); !os.IsNotExist(err) {
		t.Fatalf("the failed step's removal of keep.txt was not written back (%v)", err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "partial.txt")); err != nil || string(got) != "partial\n" {
		t.Fatalf("the failed step's partial.txt: %q (%v); want it written back", got, err)
	}
}

// TestOnlyWhatAStepChangedIsSent: a step that changes one file of many
// has that file alone copied back, as the Runtime Server counts; a step
// that changes nothing has nothing copied (no tar at all).
func TestOnlyWhatAStepChangedIsSent(t *testing.T) {
	e, w, _ := startWriteBackCounting(t, nil, writeBackLimit)
	files := map[string]string{}
	for i := range 40 {
		files[fmt.Sprintf("src/f%02d.txt", i)] = fmt.Sprintf("file %d\n", i)
	}
	dir := sharedWorkspace(t, e, "changes", files)
	// The same size, at once: the change time's tick alone cannot tell.
	st := step(t, e, "change-1", dir, "set -e; printf 'FILE 7\\n' > src/f07.txt", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
		t.Fatalf("step 1: %v exit %d stderr %q", st.GetState(), st.GetExitCode(), st.GetStderr())
	}
	if got, err := os.ReadFile(filepath.Join(dir, "src", "f07.txt")); err != nil || string(got) != "FILE 7\n" {
		t.Fatalf("src/f07.txt: %q (%v)", got, err)
	}
	// 40 files, the src and .steps directories, the step's script.
	if wb, ok := w.of("ws-changes"); !ok || wb.Whole || wb.Sent != 1 || wb.Deleted != 0 || wb.Unchanged != 42 {
		t.Fatalf("write-back %+v (reported %v); want 1 sent, 42 unchanged, none removed", wb, ok)
	}
	st = step(t, e, "change-2", dir, "cat src/f07.txt", nil)
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || st.GetStdout() != "FILE 7\n" {
		t.Fatalf("step 2: %v stdout %q stderr %q", st.GetState(), st.GetStdout(), st.GetStderr())
	}
	if wb, ok := w.of("ws-changes"); !ok || wb.Sent != 0 || wb.Deleted != 0 {
		t.Fatalf("write-back %+v (reported %v); want nothing sent or removed", wb, ok)
	}
}

// TestRemovedPathsAreChecked: the names of removed paths come from the
// sandbox, which is the step's; one with '..', an absolute one, the
// workspace itself, or one through a symbolic link of the workspace
// (out of it, or inside it) fails, and nothing is removed, the good
// names before it included; good names are removed, a link named
// itself rather than what it points to.
func TestRemovedPathsAreChecked(t *testing.T) {
	base := t.TempDir()
	ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(ws, "real"), filepath.Join(ws, "keep"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(ws, "real", "x"), filepath.Join(ws, "gone.txt"), filepath.Join(outside, "x"), filepath.Join(base, "victim")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, to := range map[string]string{"out": outside, "in": "real", "keep/tolink": outside} {
		if err := os.Symlink(to, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range [][]string{{"gone.txt", "../victim"}, {"gone.txt", "/etc"}, {"."}, {"gone.txt", "out/x"}, {"in/x"}} {
		if err := lambda.RemoveDeleted(ws, bad, nil); err == nil {
			t.Fatalf("removing %q: no error", bad)
		}
	}
	for _, f := range []string{filepath.Join(base, "victim"), filepath.Join(outside, "x"), filepath.Join(ws, "real", "x"), filepath.Join(ws, "gone.txt")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s was removed by a refused list (%v)", f, err)
		}
	}
	if err := lambda.RemoveDeleted(ws, []string{"gone.txt", "keep/tolink", "never/was"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("gone.txt: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "keep", "tolink")); !os.IsNotExist(err) {
		t.Fatalf("keep/tolink: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err != nil {
		t.Fatalf("removing the link removed what it points to: %v", err)
	}
	many := make([]string, bounds.WriteBackDeletions+1)
	for i := range many {
		many[i] = fmt.Sprintf("f%d", i)
	}
	if err := lambda.RemoveDeleted(ws, many, nil); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("over the bound: %v", err)
	}
}

// TestTooManyRemovalsAreRefused: a step that removes more separate
// entries than bounds.WriteBackDeletions (their directory kept) fails,
// saying so, and the workspace keeps them.
func TestTooManyRemovalsAreRefused(t *testing.T) {
	e, _, _ := startWriteBackCounting(t, nil, writeBackLimit)
	files := map[string]string{}
	for i := range bounds.WriteBackDeletions + 1 {
		files[fmt.Sprintf("many/%d.o", i)] = ""
	}
	dir := sharedWorkspace(t, e, "many", files)
	st := step(t, e, "remove-many", dir, "rm -f many/*.o", nil)
	if st.GetState() == pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || !strings.Contains(st.GetStderr(), "removed more than 4096 paths") {
		t.Fatalf("step: %v exit %d stderr %q; want it failed, naming the bound", st.GetState(), st.GetExitCode(), st.GetStderr())
	}
	if _, err := os.Stat(filepath.Join(dir, "many", "0.o")); err != nil {
		t.Fatalf("many/0.o: %v; want the workspace as it was", err)
	}
}
