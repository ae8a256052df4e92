package runtime

import (
	"regexp"
	"testing"
)

// An ID is its prefix and 26 lowercase base32 characters, made in one
// allocation (two under the race detector; three before, ToLower's and the
// concatenation's): a call without an invocation ID gets one.
func TestNewID(t *testing.T) {
	valid := regexp.MustCompile(`^inv_[a-z2-7]{26}$`)
	if id := newID("inv_"); !valid.MatchString(id) || id == newID("inv_") {
		t.Fatalf("newID: %q", id)
	}
	if n := testing.AllocsPerRun(100, func() { _ = newID("inv_") }); n > 2 {
		t.Fatalf("%v allocations per ID, want 1 (2 with -race)", n)
	}
}
