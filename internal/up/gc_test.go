package up

import (
	"runtime/debug"
	"testing"
)

func TestSetGC(t *testing.T) {
	was := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(was) })

	unset := func(string) (string, bool) { return "", false }
	if !SetGC(unset) {
		t.Fatal("SetGC without GOGC did not set the target")
	}
	if got := debug.SetGCPercent(100); got != GCPercent {
		t.Fatalf("without GOGC the target is %d, want %d", got, GCPercent)
	}

	// An operator's GOGC wins, even one equal to Go's default.
	set := func(k string) (string, bool) { return "100", k == "GOGC" }
	if SetGC(set) {
		t.Fatal("SetGC with GOGC=100 set the target")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC=100 the target is %d, want 100", got)
	}
}
