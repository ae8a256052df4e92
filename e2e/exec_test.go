package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/exec/exectest"
)

// awaitRunPhase polls `stoke get` until the Run reaches phase.
func (s *cliServer) awaitRunPhase(t *testing.T, name string, phase v1alpha1.Phase) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.getRun(t, name).Status.Phase != phase {
		if time.Now().After(deadline) {
			t.Fatalf("run %s did not reach %s", name, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stoke exec behaves as kubectl exec and docker exec: exit statuses, stdin,
// a real terminal with resize and ^C, Ctrl-C without one, completion.
func TestExecCLI(t *testing.T) {
	s := startCLIServer(t)
	s.ok(t, "run", "--runtime", "bash", "--name", "shell", "--detach", "--", "sleep", "100000")
	s.awaitRunPhase(t, "shell", v1alpha1.PhaseRunning)

	t.Run("exit status and separate streams", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
		}{
			{[]string{"sh", "-c", "echo out; echo err >&2; exit 3"}, 3},
			{[]string{"no-such-command-stoke"}, 127},
			{[]string{"/etc/hostname"}, 126},
			{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
			{[]string{"true"}, 0},
		} {
			r := stoke(t, s.env(), "", append([]string{"exec", "shell", "--"}, tc.args...)...)
			if r.code != tc.code {
				t.Errorf("%q: %s; want exit %d", tc.args, r, tc.code)
			}
			if tc.code == 3 && (r.stdout != "out\n" || r.stderr != "err\n") {
				t.Errorf("streams: %s", r)
			}
		}
	})

	t.Run("stdin", func(t *testing.T) {
		if r := stoke(t, s.env(), "hello", "exec", "-i", "shell", "--", "wc", "-c"); r.code != 0 || r.stdout != "5\n" {
			t.Errorf("%s", r)
		}
		// -t without a terminal on stdin runs without one, as kubectl does.
		r := stoke(t, s.env(), "typed", "exec", "-it", "shell", "--", "cat")
		if r.code != 0 || r.stdout != "typed" || !strings.Contains(r.stderr, "not a terminal") {
			t.Errorf("%s", r)
		}
	})

	t.Run("terminal", func(t *testing.T) { execTerminal(t, s.env(), "shell") })

	t.Run("Ctrl-C without a terminal", func(t *testing.T) {
		marker := exectest.Marker()
		cmd := cliCommand(context.Background(), s.env(), "exec", "shell", "--", "bash", "-c", "sleep "+marker+" & sleep "+marker)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Both sleeps run (the marker is in the CLI's and bash's command
		// lines too, so count the sleeps themselves).
		awaitSleeps(t, marker, 2)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("after Ctrl-C: %v, want exit 130", err)
		}
		exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	})

	t.Run("bad input", func(t *testing.T) {
		s.fails(t, 1, "not found", "exec", "no-such-run", "--", "true")
		s.fails(t, 1, "usage", "exec", "shell", "true")
		s.ok(t, "run", "--runtime", "bash", "--name", "finished", "--", "true")
		s.fails(t, 1, "exec needs a running task", "exec", "finished", "--", "true")
	})

	t.Run("completion", func(t *testing.T) {
		if out := s.ok(t, "__complete", "exec", "sh"); !strings.Contains(out, "shell") {
			t.Errorf("completion: %q", out)
		}
	})

	if run := s.getRun(t, "shell"); run.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("after every exec the run is %s", run.Status.Phase)
	}
}

// An exec session ends, and everything it started is gone — a process
// that left its session with setsid too — when its Run is deleted and when
// its pod is killed with kill -9.
func TestExecEndsWithRunAndPod(t *testing.T) {
	s := startCLIServer(t)
	start := func(name, marker string) *exec.Cmd {
		s.ok(t, "run", "--runtime", "bash", "--name", name, "--detach", "--", "sleep", "100000")
		s.awaitRunPhase(t, name, v1alpha1.PhaseRunning)
		cmd := cliCommand(context.Background(), s.env(), "exec", name, "--", "bash", "-c",
			"setsid sleep "+marker+" & sleep "+marker+" & sleep "+marker)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// bash, the three sleeps, and setsid's own fork when it leads a group.
		exectest.AwaitProcesses(t, marker, func(n int) bool { return n >= 4 })
		return cmd
	}
	ended := func(cmd *exec.Cmd, marker string) {
		t.Helper()
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("stoke exec: %v, want a failure", err)
		}
		exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	}

	t.Run("deleted", func(t *testing.T) {
		marker := exectest.Marker()
		cmd := start("deleted", marker)
		s.ok(t, "delete", "run", "deleted")
		ended(cmd, marker)
	})

	t.Run("pod killed", func(t *testing.T) {
		marker := exectest.Marker()
		cmd := start("victim", marker)
		// The pod is the parent of what an exec runs.
		pod := strings.TrimSpace(s.ok(t, "exec", "victim", "--", "sh", "-c", "echo $PPID"))
		pid, err := strconv.Atoi(pod)
		if err != nil {
			t.Fatalf("pod pid %q", pod)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ended(cmd, marker)
	})
}

// awaitSleeps polls /proc (outside state with no event) until n processes
// run exactly `sleep marker`, or fails.
func awaitSleeps(t *testing.T, marker string, n int) {
	t.Helper()
	want := "sleep\x00" + marker + "\x00"
	exectest.AwaitProcesses(t, marker, func(int) bool {
		count := 0
		for _, pid := range exectest.Processes(marker) {
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && string(b) == want {
				count++
			}
		}
		return count == n
	})
}

// execTerminal drives `stoke exec -it RUN -- bash` in a real terminal:
// typed input, a resize seen by stty size, Ctrl-C interrupting a
// foreground sleep, and exit 3 as the CLI's exit code.
func execTerminal(t *testing.T, env []string, run string) {
	cmd := cliCommand(t.Context(), env, "exec", "-it", run, "--", "bash", "--norc", "--noprofile")
	term, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	screen := exectest.NewScreen()
	go func() { _, _ = io.Copy(screen, term) }()
	typed := func(s string) {
		if _, err := io.WriteString(term, s); err != nil {
			t.Fatal(err)
		}
	}
	typed("echo $((6*7))\r")
	screen.Expect(t, "42\r\n")
	// Resizing the local terminal sends SIGWINCH to the CLI, which
	// resizes the remote one.
	if err := pty.Setsize(term, &pty.Winsize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		typed(`printf 'S%sE\n' "$(stty size)"` + "\r")
		if strings.HasSuffix(screen.Expect(t, "E\r\n"), "S30 100") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the remote terminal did not follow the resize")
		}
		time.Sleep(20 * time.Millisecond) // the resize travels apart from the typed bytes
	}
	marker := exectest.Marker()
	typed("sleep " + marker + "\r")
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 1 })
	typed("\x03") // raw mode: a byte for the remote terminal, not a local SIGINT
	exectest.AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	typed("echo alive-$?\r")
	screen.Expect(t, "alive-130")
	typed("exit 3\r")
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("stoke exec -it: %v, want exit 3", err)
	}
}
