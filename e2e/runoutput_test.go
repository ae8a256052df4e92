package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runlog"
)

// outputBytes is what the output tests print: 100 MB in lines of 10 bytes.
const outputBytes = 100_000_000

// printScript prints outputBytes of short lines, to stdout or, in the
// floor measurement, to a file.
var printScript = "yes 123456789 | head -c " + strconv.Itoa(outputBytes)

// taskRun is a bash task Run named name running script.
func taskRun(name, script string) *v1alpha1.Run {
	return newRun(name, v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", script}}}})
}

// runToEnd creates run and returns it once terminal.
func runToEnd(t testing.TB, u *stokeUp, w *runWatch, run *v1alpha1.Run) *v1alpha1.Run {
	t.Helper()
	u.createRun(t, run)
	return w.until(t, 5*time.Minute, run.Name+" to end", func(runs map[string]*v1alpha1.Run) bool {
		r := runs[run.Name]
		return r != nil && r.Status.Phase.Terminal()
	})[run.Name]
}

// A task printing 100 MB: its output goes to its bounded log, which says it
// was truncated and ends with the exit record, and stoke up's own log
// (stderr) carries events about the Run, not its output.
func TestTaskOutputStaysInItsLog(t *testing.T) {
	u := startUp(t, t.TempDir())
	w := u.watchRuns(t)
	// The pods are up and have said so before the measure starts.
	if r := runToEnd(t, u, w, taskRun("warm-up", "echo warm")); r.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("warm-up: %s %s", r.Status.Phase, r.Status.Message)
	}
	before := u.StderrBytes()
	run := runToEnd(t, u, w, taskRun("loud", printScript))
	atEnd := u.StderrBytes()
	if run.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("loud: %s %s", run.Status.Phase, run.Status.Message)
	}
	u.stop(t) // its stderr is read to the end now, stop events included
	grown := u.StderrBytes() - before
	t.Logf("stoke up's stderr grew by %d bytes while the task ran, %d bytes with the stop", atEnd-before, grown)
	if grown > 16<<10 {
		t.Errorf("stoke up's stderr grew by %d bytes for a task printing %d; want a few KiB of events", grown, outputBytes)
	}

	logFile := filepath.Join(u.DataDir, "logs", string(run.UID)+".log")
	fi, err := os.Stat(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > runlog.MaxBytes+64<<10 || fi.Size() < runlog.MaxBytes/2 {
		t.Errorf("the run's log is %d bytes; its bound is %d", fi.Size(), runlog.MaxBytes)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	if n := bytes.Count(b, []byte(`"stream":"truncated"`)); n != 1 {
		t.Errorf("%d truncation records, want 1", n)
	}
	if last := string(lines[len(lines)-1]); !bytes.Contains(lines[len(lines)-1], []byte(`"stream":"exit","exitCode":0`)) {
		t.Errorf("the log ends with %s, want the exit record", last)
	}
	if first := lines[0]; !bytes.Contains(first, []byte(`"stream":"stdout","line":"123456789"`)) {
		t.Errorf("the log starts with %s", first)
	}
}

// BenchmarkTaskOutput100MB: a task printing 100 MB of 10-byte lines
// through stoke up (create to Succeeded, through the HTTP API), beside
// the same pipeline writing to a file; x-floor is their ratio.
func BenchmarkTaskOutput100MB(b *testing.B) {
	u := startUp(b, b.TempDir())
	b.Cleanup(func() {
		if err := u.Stop(); err != nil {
			b.Error(err)
		}
	})
	w := u.watchRuns(b)
	runToEnd(b, u, w, taskRun("warm-up", "echo warm"))
	out := filepath.Join(b.TempDir(), "out")
	var floor, stoke time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		run := runToEnd(b, u, w, taskRun("loud-"+strconv.Itoa(i), printScript))
		stoke += time.Since(start)
		if run.Status.Phase != v1alpha1.PhaseSucceeded {
			b.Fatalf("%s: %s %s", run.Name, run.Status.Phase, run.Status.Message)
		}
		start = time.Now()
		if err := exec.Command("bash", "-c", printScript+" > "+out).Run(); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(start)
	}
	b.ReportMetric(float64(floor.Milliseconds())/float64(b.N), "floor-ms/op")
	b.ReportMetric(float64(stoke.Milliseconds())/float64(b.N), "stoke-ms/op")
	b.ReportMetric(float64(stoke)/float64(floor), "x-floor")
}

// A Python function's print() and stderr go to its Run's log under the
// invocation's ID, and not to stoke up's own log.
func TestFunctionOutputGoesToItsLog(t *testing.T) {
	u := startUp(t, t.TempDir())
	s := &cliServer{Up: u.Up}
	w := u.watchRuns(t)
	run := newRun("printer", v1alpha1.RunSpec{Runtime: "python",
		Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "printer.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "printer.py",
			Text: "import sys\nprint('imported-zebra')\ndef handle(event, context):\n    print('printed-' + event['word'])\n    print('warned-' + event['word'], file=sys.stderr)\n    return event\n"}}})
	u.createRun(t, run)
	ready := w.until(t, 2*time.Minute, "printer to be Ready", func(runs map[string]*v1alpha1.Run) bool {
		r := runs["printer"]
		return r != nil && (r.Status.Phase.Terminal() || r.Status.Phase == v1alpha1.PhaseReady && r.Status.Endpoint != "")
	})["printer"]
	if ready.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("printer: %s %s", ready.Status.Phase, ready.Status.Message)
	}
	res := invokeEndpoint(apiClient, u.Token, ready.Status.Endpoint, `{"word":"zebra"}`)
	inv := res.header.Get("X-Stoke-Invocation-ID")
	if res.err != nil || res.status != 200 || inv == "" {
		t.Fatalf("invoke: %d %s %v", res.status, res.body, res.err)
	}
	// Cancelling drains the function: its output is all in its log once
	// it is Cancelled.
	s.ok(t, "cancel", "printer", "--wait")
	got := map[string]string{}
	for _, r := range rawLog(t, s, "printer") {
		got[r.Stream+":"+r.Line] = r.InvocationID
	}
	if id, ok := got["stdout:imported-zebra"]; !ok || id != "" {
		t.Errorf("import-time print: %q %v; log %v", id, ok, got)
	}
	for _, line := range []string{"stdout:printed-zebra", "stderr:warned-zebra"} {
		if id, ok := got[line]; !ok || id != inv {
			t.Errorf("%s filed under %q (present %v), want invocation %s; log %v", line, id, ok, inv, got)
		}
	}
	u.stop(t)
	for _, l := range u.Log() {
		if strings.Contains(l, "zebra") {
			t.Errorf("stoke up logged the function's output: %s", l)
		}
	}
}
