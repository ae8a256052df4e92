package server

import (
	"runtime"
	"testing"
)

func TestSetGOMAXPROCS(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}

	runtime.GOMAXPROCS(3)
	if got := SetGOMAXPROCS(env(nil)); got != DefaultGOMAXPROCS || runtime.GOMAXPROCS(0) != DefaultGOMAXPROCS {
		t.Errorf("without GOMAXPROCS: returned %d, in effect %d; want %d", got, runtime.GOMAXPROCS(0), DefaultGOMAXPROCS)
	}
	runtime.GOMAXPROCS(3)
	if got := SetGOMAXPROCS(env(map[string]string{"GOMAXPROCS": ""})); got != DefaultGOMAXPROCS {
		t.Errorf("with GOMAXPROCS empty (which the Go runtime ignores): %d, want %d", got, DefaultGOMAXPROCS)
	}
	// Set, the Go runtime applied it at start (here: 3, standing in); it is
	// left alone.
	runtime.GOMAXPROCS(3)
	if got := SetGOMAXPROCS(env(map[string]string{"GOMAXPROCS": "3"})); got != 3 || runtime.GOMAXPROCS(0) != 3 {
		t.Errorf("with GOMAXPROCS=3: returned %d, in effect %d; want 3", got, runtime.GOMAXPROCS(0))
	}
}
