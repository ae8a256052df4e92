package python

import (
	"os"
	"slices"
	"sync"
	"testing"
)

// lineLog is a runtime.Output that keeps every line with its owner.
type lineLog struct {
	mu    sync.Mutex
	lines []string // "stream owner text"
}

func (l *lineLog) Line(stream, inv string, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, stream+" "+inv+" "+string(line))
}

func (l *lineLog) Flush() {}

func (l *lineLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// pumpedPipe is a pipe whose read end a pumped logStream files in out.
func pumpedPipe(t *testing.T, name string, out *lineLog) (*logStream, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s, err := newLogStream(name, r, out)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.pump() }()
	t.Cleanup(func() {
		w.Close()
		<-done
		r.Close()
	})
	return s, w
}

// Both streams attributed together file each byte under the owner of the
// moment it was written, whether the pipes are quiet at the boundary (one
// poll) or one of them still holds bytes (each stream waits for its
// pump).
func TestLogStreamsAttributeTogether(t *testing.T) {
	out := &lineLog{}
	stdout, wout := pumpedPipe(t, "stdout", out)
	stderr, werr := pumpedPipe(t, "stderr", out)
	p := newLogStreams(stdout, stderr)

	if p.pollBoth() {
		t.Fatal("two empty pipes polled as readable")
	}
	p.attribute("inv-1")
	if _, err := wout.WriteString("one\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := werr.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	p.attribute("") // waits until both lines are filed under inv-1
	// Written between invocations, and still in the pipe or in the pump
	// when the next one starts: the registration's, not inv-2's.
	for i := range 50 {
		if _, err := werr.WriteString("between\n"); err != nil {
			t.Fatal(err)
		}
		p.attribute("inv-2")
		if _, err := wout.WriteString("three\n"); err != nil {
			t.Fatal(err)
		}
		p.attribute("")
		got := out.all()
		want := []string{"stdout inv-1 one", "stderr inv-1 two"}
		for range i + 1 {
			want = append(want, "stderr  between", "stdout inv-2 three")
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: lines filed as\n%q\nwant\n%q", i, got, want)
		}
	}
	if p.pollBoth() {
		t.Fatal("drained pipes polled as readable")
	}
	stderr.mu.Lock() // the pump reads nothing meanwhile
	if _, err := werr.WriteString("x"); err != nil {
		t.Fatal(err)
	}
	readable := p.pollBoth()
	stderr.mu.Unlock()
	if !readable {
		t.Fatal("a pipe holding a byte its pump cannot read (its mutex held) polled as quiet")
	}
}
