package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Concurrent writers lose nothing (and -race sees no race); Bytes is a
// copy the buffer does not change afterwards.
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				fmt.Fprintf(&b, "%d\n", i)
			}
		}()
	}
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
	snap := b.Bytes()
	b.Write([]byte("more"))
	if len(snap) != 1600 {
		t.Fatalf("Bytes changed after a write: %d bytes", len(snap))
	}
}
