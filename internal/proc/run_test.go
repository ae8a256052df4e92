package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Run returns the program's exit: nil for status 0, the exit error
// otherwise.
func TestRunReturnsTheExit(t *testing.T) {
	if err := Run(context.Background(), exec.Command("true"), 0); err != nil {
		t.Fatalf("true: %v", err)
	}
	var ee *exec.ExitError
	if err := Run(context.Background(), exec.Command("sh", "-c", "exit 3"), 0); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit 3: %v", err)
	}
}

// When ctx ends, Run stops the whole group, a background child ignoring
// SIGTERM included, and returns ctx's error.
func TestRunStopsTheGroupWhenItsContextEnds(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, exec.Command("bash", "-c", `trap '' TERM; sleep 300 & echo $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`, "bash", pidFile), 20*time.Millisecond)
	}()
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 {
		if b, err := os.ReadFile(pidFile); err == nil {
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		} else if time.Now().After(deadline) {
			t.Fatal("the background child never started")
		} else {
			time.Sleep(time.Millisecond) // polling a file the child writes
		}
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	waitGone(t, child)
}
