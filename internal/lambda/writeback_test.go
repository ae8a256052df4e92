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
	sim := simulator(t)
	srv := newServerWith(t, sim, "bash", func(c *lambda.Config) { c.WriteBackBytes, c.Observe = writeBackLimit, observe })
	rs := runtimetest.StartServer(t, runtimetest.Harness{
		Runtime:  "lambda",
		Fixtures: func(runtimetest.Fixture) runtimetest.Source { return runtimetest.Source{} },
	}, func(c *server.Config) { serve(c, srv) })
	return env{sim: sim, rs: rs}
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
// (it writes a file of 64 KiB) in a Run's own directory, which is not
// written back, and in a shared workspace, which is; p50 of each from the
// Runtime service's Execute to its Wait's answer, and of the write-back
// alone (the TaskEnded event to the release).
func BenchmarkTaskWriteBack(b *testing.B) {
	var mu sync.Mutex
	var copies []time.Duration
	e := startWriteBack(b, func(what string, d time.Duration) {
		if what == "write-back" {
			mu.Lock()
			copies = append(copies, d)
			mu.Unlock()
		}
	})
	const script = "head -c 65536 /dev/zero > out.bin"
	var plain, shared []time.Duration
	for i := range b.N {
		for _, ws := range []bool{false, true} {
			dir := e.rs.Dir(b, runtimetest.Source{})
			if ws {
				dir = sharedWorkspace(b, e, fmt.Sprintf("bench-%d", i), nil)
			}
			start := time.Now()
			st := step(b, e, fmt.Sprintf("bench-%d-%t", i, ws), dir, script, nil)
			took := time.Since(start)
			if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
				b.Fatalf("step: %v %q", st.GetState(), st.GetStderr())
			}
			if ws {
				shared = append(shared, took)
			} else {
				plain = append(plain, took)
			}
		}
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	b.ReportMetric(p50ms(plain), "step-p50-ms")
	b.ReportMetric(p50ms(shared), "step-written-back-p50-ms")
	b.ReportMetric(p50ms(copies), "write-back-p50-ms")
}

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
