package randid

import (
	"regexp"
	"strings"
	"testing"
)

// An ID is its prefix and 26 lowercase base32 characters, different every
// time, made in one allocation (two under the race detector).
func TestNew(t *testing.T) {
	valid := regexp.MustCompile(`^inv_[a-z2-7]{26}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := New("inv_")
		if !valid.MatchString(id) {
			t.Fatalf("%q is not inv_ and 26 lowercase base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("%q made twice", id)
		}
		seen[id] = true
	}
	long := strings.Repeat("p", 60)
	if id := New(long); len(id) != len(long)+Len || !strings.HasPrefix(id, long) {
		t.Fatalf("New with a long prefix: %q", id)
	}
	if n := testing.AllocsPerRun(100, func() { _ = New("inv_") }); n > 2 {
		t.Fatalf("%v allocations per ID, want 1 (2 with -race)", n)
	}
}
