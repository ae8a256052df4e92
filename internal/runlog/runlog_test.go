package runlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newPair returns the writing and the reading side of one directory.
func newPair(t *testing.T) (*Files, *Store) {
	t.Helper()
	dir := t.TempDir()
	fs, err := NewFiles(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fs, s
}

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
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var rec Record
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("%q: %v", sc.Bytes(), err)
			}
			out = append(out, rec)
		}
	}
}

// must returns the Sink of an Open that must succeed.
func must(t *testing.T) func(*Sink, error) *Sink {
	return func(s *Sink, err error) *Sink {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func TestSinksFileOutputByRun(t *testing.T) {
	fs, s := newPair(t)
	task := must(t)(fs.OpenExecution(ExecutionID("u1", 2)))
	task.Line(StreamStdout, "", []byte("hello"))
	task.Line(StreamStderr, "", []byte("warn"))
	task.Exit(3)
	task.Close()
	fn := must(t)(fs.OpenRun("u2"))
	fn.Line(StreamStderr, "inv_1", []byte("fn says"))
	fn.Close()
	other := must(t)(fs.OpenExecution("job-1"))
	other.Line(StreamStdout, "", []byte("not runtimed's"))
	other.Close()
	for _, bad := range []string{"", "../escape", "a/b", "."} {
		if _, err := fs.OpenRun(bad); err == nil {
			t.Errorf("OpenRun(%q) succeeded", bad)
		}
	}

	got := readAll(t, s, "u1")
	if len(got) != 3 || got[0].Line != "hello" || got[0].Stream != StreamStdout || got[0].Attempt != 2 || got[0].Time.IsZero() ||
		got[1].Stream != StreamStderr || got[2].Stream != StreamExit || got[2].ExitCode == nil || *got[2].ExitCode != 3 {
		t.Errorf("u1 log = %+v", got)
	}
	if recs := readAll(t, s, "u2"); len(recs) != 1 || recs[0].InvocationID != "inv_1" || recs[0].Line != "fn says" || recs[0].Attempt != 0 {
		t.Errorf("u2 log = %+v", recs)
	}
	if recs := readAll(t, s, "job-1"); len(recs) != 1 || recs[0].Attempt != 0 {
		t.Errorf("job-1 log = %+v", recs)
	}
	s.Remove("u1")
	if recs := readAll(t, s, "u1"); len(recs) != 0 {
		t.Errorf("after Remove: %+v", recs)
	}
	var nilSink *Sink // discards
	nilSink.Line(StreamStdout, "", []byte("x"))
	nilSink.Exit(0)
	nilSink.Flush()
	nilSink.Close()
}

// A Sink writes when flushed (or when its buffer fills), never a line at a
// time, and a Run without output has no file.
func TestSinkWritesWhenFlushed(t *testing.T) {
	fs, s := newPair(t)
	quiet := must(t)(fs.OpenRun("quiet"))
	quiet.Close()
	if _, err := os.Stat(s.path("quiet")); !os.IsNotExist(err) {
		t.Errorf("a Run without output has a log file: %v", err)
	}

	out := must(t)(fs.OpenRun("r"))
	defer out.Close()
	out.Line(StreamStdout, "", []byte("one"))
	if recs := readAll(t, s, "r"); len(recs) != 0 {
		t.Fatalf("written before a flush: %+v", recs)
	}
	out.Flush()
	if recs := readAll(t, s, "r"); len(recs) != 1 {
		t.Fatalf("after the flush: %+v", recs)
	}
	line := []byte(strings.Repeat("y", 1000))
	for range 2 * flushAt / len(line) {
		out.Line(StreamStdout, "", line)
	}
	if n := len(readAll(t, s, "r")); n < flushAt/len(line) {
		t.Errorf("%d records written with more than %d bytes buffered", n, flushAt)
	}
}

// Past the bound: one truncation marker, no more output, but every
// attempt's exit record, within the reserve; a Sink opened later (the
// next attempt, maybe in another process) finds the log full.
func TestSinkStopsAtTheBoundButKeepsExitRecords(t *testing.T) {
	fs, s := newPair(t)
	line := []byte(strings.Repeat("x", 16<<10))
	first := must(t)(fs.OpenExecution(ExecutionID("big", 1)))
	for range MaxBytes/len(line) + 10 {
		first.Line(StreamStdout, "", line)
	}
	first.Exit(1)
	first.Close()
	for a := int32(2); a <= 100; a++ {
		next := must(t)(fs.OpenExecution(ExecutionID("big", a)))
		next.Line(StreamStdout, "", []byte("after"))
		next.Exit(a)
		next.Close()
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

// Two Sinks of one Run (a registration and its successor) share the file
// and its bound, from several goroutines.
func TestSinksOfOneRunShareItsFile(t *testing.T) {
	fs, s := newPair(t)
	a := must(t)(fs.OpenRun("fn"))
	b := must(t)(fs.OpenRun("fn"))
	var wg sync.WaitGroup
	for _, out := range []*Sink{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				out.Line(StreamStderr, "", []byte("concurrent"))
			}
			out.Flush()
		}()
	}
	wg.Wait()
	a.Close()
	b.Line(StreamStderr, "", []byte("still open"))
	b.Close()
	b.Close() // twice is fine
	recs := readAll(t, s, "fn")
	if len(recs) != 4001 || recs[4000].Line != "still open" {
		t.Errorf("%d records, last %+v", len(recs), recs[len(recs)-1])
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.open) != 0 {
		t.Errorf("%d files open after every Sink closed", len(fs.open))
	}
}

// While Run runs, a write by any process to any log wakes followers.
func TestStoreWakesFollowersOnWrites(t *testing.T) {
	fs, s := newPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	r, err := s.Open("f")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, err := r.Next(1024); b != nil || err != nil {
		t.Fatalf("empty log: %q %v", b, err)
	}
	out := must(t)(fs.OpenRun("f"))
	defer out.Close()
	for _, text := range []string{"one", "two"} {
		changed := s.Changed()
		var b []byte
		// The watch may start after the first write: write until woken.
		for woken := false; !woken; {
			out.Line(StreamStdout, "", []byte(text))
			out.Flush()
			select {
			case <-changed:
				woken = true
			case <-time.After(100 * time.Millisecond):
			}
		}
		if b, err = r.Next(1 << 16); err != nil || !strings.Contains(string(b), `"line":"`+text+`"`) {
			t.Fatalf("Next = %q, %v", b, err)
		}
	}
}

// A log left with less room than a record by an earlier attempt is full
// for the next one, which says so once.
func TestSinkOnANearlyFullLog(t *testing.T) {
	fs, s := newPair(t)
	line := []byte(strings.Repeat("z", 1000))
	first := must(t)(fs.OpenExecution(ExecutionID("near", 1)))
	for {
		fi, err := os.Stat(s.path("near"))
		if err == nil && fi.Size() >= MaxBytes-maxRecord {
			break
		}
		first.Line(StreamStdout, "", line)
		first.Flush()
	}
	first.Exit(0)
	first.Close()
	second := must(t)(fs.OpenExecution(ExecutionID("near", 2)))
	second.Line(StreamStdout, "", []byte("dropped"))
	second.Line(StreamStdout, "", []byte("dropped too"))
	second.Exit(0)
	second.Close()
	recs := readAll(t, s, "near")
	tail := recs[len(recs)-3:]
	if tail[0].Stream != StreamExit || tail[1].Stream != StreamTruncated || tail[1].Attempt != 2 || tail[2].Stream != StreamExit || tail[2].Attempt != 2 {
		t.Errorf("end of the log: %+v", tail)
	}
}

// The plain encoding of output records is what json.Marshal makes of them,
// and anything else falls back to json.Marshal.
func TestEncodeIsJSONMarshal(t *testing.T) {
	code := int32(3)
	east := time.FixedZone("east", 5*3600+1800)
	for _, rec := range []Record{
		{Time: time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC), Attempt: 1, Stream: StreamStdout, Line: "hello"},
		{Time: time.Date(2026, 12, 1, 10, 0, 0, 0, east), Stream: StreamStderr, Line: "x", InvocationID: "inv_1"},
		{Time: time.Date(2026, 12, 1, 10, 0, 0, 100, time.Local), Stream: StreamStdout},
		{Time: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Stream: StreamStdout, Line: `quote " and \ and <tag> & tab	é` + "\x00\xff"},
		{Time: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Attempt: 7, Stream: StreamExit, ExitCode: &code},
		{Stream: StreamStdout, Line: "no time"},
	} {
		want, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		f := &file{}
		if got := f.encode(rec); string(got) != string(want)+"\n" {
			t.Errorf("encode(%+v)\n = %s\nwant %s", rec, got, want)
		}
	}
}
