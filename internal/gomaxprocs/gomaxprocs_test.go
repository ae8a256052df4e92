package gomaxprocs

import (
	"runtime"
	"testing"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestApply(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })

	runtime.GOMAXPROCS(3)
	if got := Apply(env(nil), 1); got != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("without GOMAXPROCS: returned %d, in effect %d; want 1", got, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(3)
	if got := Apply(env(map[string]string{"GOMAXPROCS": ""}), 2); got != 2 {
		t.Errorf("with GOMAXPROCS empty (which the Go runtime ignores): %d, want 2", got)
	}
	if got := Apply(env(nil), 0); got != 1 {
		t.Errorf("n 0: %d, want 1", got)
	}
	// Set, the Go runtime applied it at start (here: 3, standing in); it is
	// left alone.
	runtime.GOMAXPROCS(3)
	if got := Apply(env(map[string]string{"GOMAXPROCS": "3"}), 1); got != 3 || runtime.GOMAXPROCS(0) != 3 {
		t.Errorf("with GOMAXPROCS=3: returned %d, in effect %d; want 3", got, runtime.GOMAXPROCS(0))
	}
}

func TestHalf(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 1, 4: 2, 9: 4} {
		runtime.GOMAXPROCS(procs)
		if got := Half(); got != want {
			t.Errorf("Half of %d = %d, want %d", procs, got, want)
		}
	}
}
