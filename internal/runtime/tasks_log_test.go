package runtime_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runlog"
	rt "stoke.dev/stoke/internal/runtime"
)

// logRecords reads the records of the log name in dir.
func logRecords(t *testing.T, dir, name string) []runlog.Record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []runlog.Record
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r runlog.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%q: %v", sc.Bytes(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// An execution's output goes to its Run's log under its attempt, and the
// exit record ends it; past the log's bound the output is dropped but still
// read, so that the tail in the status is the program's last output.
func TestExecutionOutputGoesToItsRunLog(t *testing.T) {
	dir := t.TempDir()
	logs, err := runlog.NewFiles(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *rt.TasksConfig) { c.Logs = logs })

	st := f.run(t, &pb.ExecuteRequest{Id: "run-a.2", Args: []string{"bash", "-c", "echo out; echo err >&2; exit 4"}})
	if st.GetExitCode() != 4 {
		t.Fatalf("exit code %d", st.GetExitCode())
	}
	recs := logRecords(t, dir, "run-a")
	got := map[string]bool{}
	for _, r := range recs {
		got[r.Stream+":"+r.Line] = r.Attempt == 2
	}
	last := recs[len(recs)-1]
	if len(recs) != 3 || !got["stdout:out"] || !got["stderr:err"] || last.Stream != runlog.StreamExit || *last.ExitCode != 4 || last.Attempt != 2 {
		t.Errorf("log %+v", recs)
	}

	// 20 MB of stdout, then a last line: the log keeps its bound, the
	// status the end.
	st = f.run(t, &pb.ExecuteRequest{Id: "run-b.1", Args: []string{"bash", "-c", "yes 0123456789 | head -c 20000000; echo THE-END"}})
	if !strings.HasSuffix(st.GetStdout(), "THE-END\n") {
		t.Errorf("stdout tail ends %q", st.GetStdout()[max(0, len(st.GetStdout())-40):])
	}
	recs = logRecords(t, dir, "run-b")
	markers := 0
	for _, r := range recs {
		if r.Stream == runlog.StreamTruncated {
			markers++
		}
		if r.Line == "THE-END" {
			t.Error("output past the bound is in the log")
		}
	}
	if last := recs[len(recs)-1]; markers != 1 || last.Stream != runlog.StreamExit || *last.ExitCode != 0 {
		t.Errorf("%d truncation records, last record %+v", markers, last)
	}
}
