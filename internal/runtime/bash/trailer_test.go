package bash

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/bounds"
)

const testNonce = "0123456789abcdef"

var testMarker = []byte("\x1e" + testNonce + " ")

// feed writes data into r through space and took in reads of the given
// sizes (cycled; a size of 0 counts as 1), as the FIFO's reader does, and
// calls findTrailer after each read. It reports whether a trailer was
// found, and stops there as run does.
func feed(r *output, data []byte, sizes []int) bool {
	for k := 0; len(data) > 0; k++ {
		n := 1
		if len(sizes) > 0 {
			n = max(1, sizes[k%len(sizes)])
		}
		sp := r.space()
		n = copy(sp[:min(n, len(sp))], data)
		data = data[n:]
		r.took(n)
		if r.findTrailer() {
			return true
		}
	}
	return false
}

// parseWhole is the trailer parser's specification, applied to everything
// at once: the first marker followed by a complete line "done SEQ PID
// STATUS" ends the output; markers that start anything else are output.
func parseWhole(data, marker []byte, seq uint64) (out []byte, pid, rc int, found bool) {
	for i := 0; ; i++ {
		j := bytes.Index(data[i:], marker)
		if j < 0 {
			return nil, 0, 0, false
		}
		i += j
		line, _, complete := bytes.Cut(data[i+len(marker):], []byte("\n"))
		if !complete {
			return nil, 0, 0, false
		}
		f := strings.Fields(string(line))
		if len(f) == 4 && f[0] == "done" && f[1] == strconv.FormatUint(seq, 10) {
			pid, _ = strconv.Atoi(f[2])
			rc, _ = strconv.Atoi(f[3])
			return data[:i], pid, rc, true
		}
	}
}

func trailerLine(seq, pid, rc int) string {
	return string(testMarker) + "done " + strconv.Itoa(seq) + " " + strconv.Itoa(pid) + " " + strconv.Itoa(rc) + "\n"
}

func TestTrailer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		found   bool
		out     string
		pid, rc int
	}{
		{name: "output and trailer", data: "hello\n" + trailerLine(7, 4242, 0), found: true, out: "hello\n", pid: 4242},
		{name: "no output", data: trailerLine(7, 1, 3), found: true, out: "", pid: 1, rc: 3},
		{name: "output without newline", data: `{"a":1}` + trailerLine(7, 9, 0), found: true, out: `{"a":1}`, pid: 9},
		{name: "no trailer", data: "just output\n", found: false},
		{name: "trailer line not complete", data: "x" + strings.TrimSuffix(trailerLine(7, 9, 0), "\n"), found: false},
		{name: "marker cut short", data: "x" + string(testMarker[:5]), found: false},
		{name: "another request's trailer is output",
			data: "a" + trailerLine(6, 1, 0) + "b" + trailerLine(7, 2, 5), found: true, out: "a" + trailerLine(6, 1, 0) + "b", pid: 2, rc: 5},
		{name: "another nonce is output",
			data: "\x1efedcba9876543210 done 7 1 0\n" + trailerLine(7, 2, 0), found: true, out: "\x1efedcba9876543210 done 7 1 0\n", pid: 2},
		{name: "extra fields are output",
			data: string(testMarker) + "done 7 1 0 extra\n" + trailerLine(7, 2, 0), found: true, out: string(testMarker) + "done 7 1 0 extra\n", pid: 2},
		{name: "a word other than done is output",
			data: string(testMarker) + "sync 7\n" + trailerLine(7, 3, 0), found: true, out: string(testMarker) + "sync 7\n", pid: 3},
		{name: "output after the trailer is dropped", data: "x" + trailerLine(7, 2, 1) + "background job\n", found: true, out: "x", pid: 2, rc: 1},
		{name: "a marker inside a line", data: "abc" + trailerLine(7, 2, 0), found: true, out: "abc", pid: 2},
		{name: "marker byte alone", data: "\x1e\x1e" + trailerLine(7, 2, 0), found: true, out: "\x1e\x1e", pid: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every split into two reads, and one byte at a time, gives the
			// same answer: a read may end anywhere in the marker or line.
			splits := [][]int{{1}, {len(tc.data) + 1}}
			for i := 1; i < len(tc.data); i++ {
				splits = append(splits, []int{i, len(tc.data)})
			}
			for _, sizes := range splits {
				r := newOutput(testMarker, 7)
				found := feed(r, []byte(tc.data), sizes)
				if found != tc.found || r.trailer != tc.found {
					t.Fatalf("reads %v: found %v (trailer %v), want %v", sizes, found, r.trailer, tc.found)
				}
				if !found {
					continue
				}
				if string(r.out) != tc.out || r.pid != tc.pid || r.rc != tc.rc {
					t.Fatalf("reads %v: out %q pid %d rc %d, want %q %d %d", sizes, r.out, r.pid, r.rc, tc.out, tc.pid, tc.rc)
				}
			}
		})
	}
}

// TestTrailerBound checks that output past the bound is read and dropped:
// the buffer never grows past it, and over reports it.
func TestTrailerBound(t *testing.T) {
	r := newOutput(testMarker, 1)
	chunk := bytes.Repeat([]byte("y"), 64<<10)
	total := 0
	for total <= r.keep+len(chunk) {
		sp := r.space()
		if len(sp) == 0 {
			t.Fatalf("no space to read into after %d bytes", total)
		}
		n := copy(sp, chunk)
		r.took(n)
		total += n
		if r.findTrailer() {
			t.Fatal("found a trailer in plain output")
		}
	}
	if !r.over() {
		t.Fatalf("over() is false after %d bytes (bound %d)", total, bounds.InvokeBody)
	}
	if len(r.buf) > r.keep+1 {
		t.Fatalf("kept %d bytes, more than the bound %d plus one", len(r.buf), r.keep)
	}
}

// FuzzTrailer checks the incremental parser against its specification
// (parseWhole): whatever the output and however the reads cut it, the
// answer is the same, and the output is exactly what precedes the trailer.
// The seed corpus is in testdata/fuzz/FuzzTrailer.
func FuzzTrailer(f *testing.F) {
	f.Add([]byte("hello\n"+trailerLine(7, 4242, 0)), []byte{1})
	f.Add([]byte("a"+trailerLine(6, 1, 0)+"b"+trailerLine(7, 2, 5)), []byte{3, 17})
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		if len(data) > 64<<10 {
			return // far below the bound, which TestTrailerBound covers
		}
		var sz []int
		for _, s := range sizes {
			sz = append(sz, int(s))
		}
		r := newOutput(testMarker, 7)
		found := feed(r, data, sz)
		out, pid, rc, want := parseWhole(data, testMarker, 7)
		if found != want || r.trailer != want {
			t.Fatalf("found %v (trailer %v), the whole input says %v", found, r.trailer, want)
		}
		if !found {
			return
		}
		if !bytes.Equal(r.out, out) || r.pid != pid || r.rc != rc {
			t.Fatalf("out %q pid %d rc %d, the whole input says %q %d %d", r.out, r.pid, r.rc, out, pid, rc)
		}
		if !bytes.HasPrefix(data, r.out) || !bytes.HasPrefix(data[len(r.out):], testMarker) {
			t.Fatalf("out %q is not the input up to a marker", r.out)
		}
	})
}
