package runtime

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// tailBuffer keeps the last max bytes written to it: the end of a
// program's output is where its errors and results are; the stream goes
// to the Run's log, up to the log's bound. It is a ring that grows to max as needed, so a quiet
// program costs little.
type tailBuffer struct {
	max int

	mu    sync.Mutex
	buf   []byte // len ≤ max; once full, a ring starting at start
	start int
	total int64 // bytes ever written
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(n)
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		b.start = 0
		return n, nil
	}
	if room := b.max - len(b.buf); room > 0 {
		k := min(room, len(p))
		b.buf = append(b.buf, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 { // full: overwrite the oldest bytes
		k := copy(b.buf[b.start:], p)
		p = p[k:]
		b.start = (b.start + k) % b.max
	}
	return n, nil
}

// String returns the kept bytes as valid UTF-8 (protobuf strings must be),
// at most max bytes: a sequence split by the cut is dropped, invalid bytes
// become U+FFFD.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	data := make([]byte, 0, len(b.buf))
	data = append(data, b.buf[b.start:]...)
	data = append(data, b.buf[:b.start]...)
	cut := b.total > int64(len(b.buf))
	b.mu.Unlock()
	if cut {
		for i := 0; i < utf8.UTFMax-1 && len(data) > 0 && !utf8.RuneStart(data[0]); i++ {
			data = data[1:]
		}
	}
	s := strings.ToValidUTF8(string(data), "\uFFFD")
	if len(s) > b.max { // replacements can be longer than what they replace
		s = s[len(s)-b.max:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	return s
}

// release frees the buffer once its content was kept elsewhere; later
// writes (none are expected) start a new one.
func (b *tailBuffer) release() {
	b.mu.Lock()
	b.buf, b.start = nil, 0
	b.mu.Unlock()
}
