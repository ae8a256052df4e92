package loglines

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestPumpSize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		max  int
		want []string
	}{
		{"lines", "a\nbb\nccc\n", 10, []string{"a", "bb", "ccc"}},
		{"no final newline", "a\nbb", 10, []string{"a", "bb"}},
		{"empty lines kept", "a\n\nb\n", 10, []string{"a", "", "b"}},
		{"split long line", "abcdefghij\n", 4, []string{"abcd", "efgh", "ij"}},
		{"long line exact", "abcdefgh\n", 4, []string{"abcd", "efgh"}},
		{"exact then more", "abcdx", 4, []string{"abcd", "x"}},
		{"long tail without newline", "abcdefghij", 4, []string{"abcd", "efgh", "ij"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tt.in), iotest.OneByteReader(strings.NewReader(tt.in))} {
				var got []string
				PumpSize(r, tt.max, func(line []byte) { got = append(got, string(line)) })
				if strings.Join(got, "|") != strings.Join(tt.want, "|") {
					t.Fatalf("got %q, want %q", got, tt.want)
				}
			}
		})
	}
}

// Ten MiB without a newline is emitted in bounded pieces and never held
// whole.
func TestPumpBoundsMemory(t *testing.T) {
	const size = 10 << 20
	var n, pieces, longest int
	Pump(io.LimitReader(repeatReader('e'), size), func(line []byte) {
		n += len(line)
		pieces++
		longest = max(longest, len(line))
	})
	if n != size || longest > 16<<10 || pieces < size/(16<<10) {
		t.Fatalf("emitted %d bytes in %d pieces, longest %d", n, pieces, longest)
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	copy(p, bytes.Repeat([]byte{byte(r)}, len(p)))
	return len(p), nil
}

// PumpFlush flushes before every read, so every line emitted before a read
// that would wait is flushed before it.
func TestPumpFlushBeforeEveryRead(t *testing.T) {
	var events []string
	PumpFlush(iotest.OneByteReader(strings.NewReader("a\nb\n")),
		func(line []byte) { events = append(events, "emit "+string(line)) },
		func() { events = append(events, "flush") })
	got := strings.Join(events, ",")
	want := "flush,flush,emit a,flush,flush,emit b,flush"
	if got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}
