package runlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func readAll(t *testing.T, s *Store, uid string) []Record {
	t.Helper()
	r, err := s.Open(uid)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []Record
	for {
		b, err := r.Next(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			return out
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var rec Record
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("%q: %v", sc.Bytes(), err)
			}
			out = append(out, rec)
		}
	}
}

func TestIngestFilesOutputByRun(t *testing.T) {
	s, err := New(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, l := range []string{
		`{"time":"2026-12-01T10:00:00Z","level":"INFO","msg":"execution started","execution_id":"u1.1"}`,
		`{"time":"2026-12-01T10:00:01Z","level":"INFO","msg":"output","execution_id":"u1.1","stream":"stdout","line":"hello"}`,
		`{"time":"2026-12-01T10:00:02Z","level":"INFO","msg":"output","execution_id":"u1.1","stream":"stderr","line":"warn"}`,
		`{"time":"2026-12-01T10:00:03Z","level":"INFO","msg":"execution finished","execution_id":"u1.1","exit_code":3}`,
		`{"time":"2026-12-01T10:00:04Z","level":"INFO","msg":"output","run_uid":"u2","invocation_id":"inv_1","stream":"stderr","line":"fn says"}`,
		`{"msg":"output","run_uid":"../escape","stream":"stdout","line":"x"}`,
		`{"msg":"output","execution_id":"noattempt","stream":"stdout","line":"x"}`,
		`{"msg":"output","run_uid":"u3","stream":"bogus","line":"x"}`,
		`not json "msg":"output"`,
	} {
		s.Ingest([]byte(l))
	}
	got := readAll(t, s, "u1")
	if len(got) != 3 || got[0].Line != "hello" || got[0].Stream != StreamStdout || got[0].Attempt != 1 ||
		got[1].Stream != StreamStderr || got[2].Stream != StreamExit || got[2].ExitCode == nil || *got[2].ExitCode != 3 {
		t.Errorf("u1 log = %+v", got)
	}
	fn := readAll(t, s, "u2")
	if len(fn) != 1 || fn[0].InvocationID != "inv_1" || fn[0].Line != "fn says" {
		t.Errorf("u2 log = %+v", fn)
	}
	for _, uid := range []string{"u3", "noattempt", "../escape"} {
		if recs := readAll(t, s, uid); len(recs) != 0 {
			t.Errorf("%s log = %+v; want nothing", uid, recs)
		}
	}
	entries, _ := os.ReadDir(s.dir)
	if len(entries) != 2 {
		t.Errorf("log directory holds %d files, want 2", len(entries))
	}
	s.Remove("u1")
	if recs := readAll(t, s, "u1"); len(recs) != 0 {
		t.Errorf("after Remove: %+v", recs)
	}
}

func TestAppendStopsAtTheBoundWithOneMarker(t *testing.T) {
	s, err := New(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	line := strings.Repeat("x", 16<<10)
	for range MaxBytes/len(line) + 10 {
		s.Append("big", Record{Attempt: 1, Stream: StreamStdout, Line: line})
	}
	// Each attempt's exit record is still written, and nothing else.
	for a := int32(1); a <= 100; a++ {
		code := a
		s.Append("big", Record{Attempt: a, Stream: StreamExit, ExitCode: &code})
		s.Append("big", Record{Attempt: a, Stream: StreamStdout, Line: "after"})
	}
	fi, err := os.Stat(s.path("big"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > MaxBytes+exitReserve {
		t.Errorf("log is %d bytes; bound %d", fi.Size(), MaxBytes+exitReserve)
	}
	recs := readAll(t, s, "big")
	markers, exits := 0, 0
	for i, r := range recs {
		switch r.Stream {
		case StreamTruncated:
			markers++
		case StreamExit:
			exits++
			if r.ExitCode == nil || *r.ExitCode != r.Attempt {
				t.Errorf("exit record %+v", r)
			}
		case StreamStdout:
			if markers > 0 || r.Line == "after" {
				t.Fatalf("record %d: output after the marker: %+v", i, r)
			}
		}
	}
	if markers != 1 || exits != 100 || recs[len(recs)-1].Stream != StreamExit {
		t.Errorf("%d markers, %d exit records, last %q; want 1, 100, exit", markers, exits, recs[len(recs)-1].Stream)
	}
}

func TestReaderPicksUpAppendsAndWakesFollowers(t *testing.T) {
	s, err := New(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Open("f")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, err := r.Next(1024); b != nil || err != nil {
		t.Fatalf("empty log: %q %v", b, err)
	}
	changed := s.Changed()
	s.Append("f", Record{Stream: StreamStdout, Line: "one"})
	<-changed // closed by the write
	b, err := r.Next(1024)
	if err != nil || !strings.Contains(string(b), `"line":"one"`) {
		t.Fatalf("Next = %q, %v", b, err)
	}
	s.Append("f", Record{Stream: StreamStdout, Line: "two"})
	if b, _ := r.Next(1024); !strings.Contains(string(b), `"line":"two"`) || strings.Contains(string(b), "one") {
		t.Errorf("second Next = %q", b)
	}
}

func TestManyRunsKeepFewFilesOpen(t *testing.T) {
	s, err := New(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 3 * maxOpen {
		s.Append(strings.Repeat("r", 1+i%maxOpen)+string(rune('a'+i/maxOpen)), Record{Stream: StreamStdout, Line: "x"})
	}
	if len(s.files) > maxOpen || s.lru.Len() != len(s.files) {
		t.Errorf("%d files open (lru %d), bound %d", len(s.files), s.lru.Len(), maxOpen)
	}
}
