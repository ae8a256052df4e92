package proc

import (
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// preadAll reads a children file longer than its first buffer whole: a
// read that fills the buffer is followed by another, and only a short
// one ends it.
func TestPreadAllReadsPastAFullBuffer(t *testing.T) {
	const n = 40
	p, pids := startSession(t, `for i in $(seq `+strconv.Itoa(n)+`); do sleep 1000 & echo $!; done; echo ready; wait`)
	sc, err := NewChildScanner(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	for _, start := range []int{0, 1, 8, 64} {
		b, err := preadAll(sc.children, make([]byte, 0, start))
		if err != nil {
			t.Fatal(err)
		}
		got := parsePids(b)
		slices.Sort(got)
		want := slices.Sorted(slices.Values(pids))
		if len(want) != n || !slices.Equal(got, want) {
			t.Fatalf("from a buffer of %d: read %v, want %v", start, got, want)
		}
	}
}

// A list that fits the buffer is one read: the short read is its end
// (the Subreaper's read after every call made two).
func TestPreadAllShortReadIsTheEnd(t *testing.T) {
	p, pids := startSession(t, `sleep 1000 & echo $!; echo ready; wait`)
	sc, err := NewChildScanner(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	reads := 0
	pread = func(fd int, p []byte, off int64) (int, error) {
		reads++
		return unix.Pread(fd, p, off)
	}
	defer func() { pread = unix.Pread }()
	b, err := preadAll(sc.children, make([]byte, 0, 64))
	if err != nil || !slices.Equal(parsePids(b), pids) {
		t.Fatalf("read %q (%v), want %v", b, err, pids)
	}
	if reads != 1 {
		t.Fatalf("%d reads, want 1", reads)
	}
}
