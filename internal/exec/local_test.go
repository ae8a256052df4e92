package exec_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dirTargets are Runs that are directories of this test, alive until the
// test ends.
type dirTargets struct {
	dir   string
	ended chan struct{}
}

func (d dirTargets) ExecTarget(runUID, _ string) (exec.Target, error) {
	return exec.Target{Dir: d.dir, Env: []string{"PATH=/usr/bin:/bin"}, Ended: d.ended}, nil
}

// A Runtime Server takes at most bounds.ExecSessionsPerServer sessions,
// each Run at most bounds.ExecSessionsPerRun; past either the next is
// refused at once, and Close ends every session.
func TestLocalLimits(t *testing.T) {
	l := exec.NewLocal(exec.LocalConfig{Targets: dirTargets{dir: t.TempDir(), ended: make(chan struct{})}})
	ctx := context.Background()
	marker := exectest.Marker()
	start := func(run int) (exec.Session, error) {
		return l.Start(ctx, exec.Request{RunUID: fmt.Sprintf("run-%d", run), Command: []string{"sleep", marker}})
	}
	n := 0
	for run := 0; n < bounds.ExecSessionsPerServer; run++ {
		for range bounds.ExecSessionsPerRun {
			if n == bounds.ExecSessionsPerServer {
				break
			}
			if _, err := start(run); err != nil {
				t.Fatalf("session %d: %v", n, err)
			}
			n++
		}
	}
	if _, err := start(1000); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("session past the server's limit: %v", err)
	}
	if _, err := start(0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("session past the run's limit: %v", err)
	}
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == bounds.ExecSessionsPerServer })
	l.Close()
	if l.Open() != 0 {
		t.Errorf("%d sessions open after Close", l.Open())
	}
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	if _, err := start(0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("after Close: %v", err)
	}
}
