package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// testRunInteractive drives the main process's stdin and terminal with
// the CLI: `docker run -i` with stdin to its EOF, `docker run -it` under
// a pseudo-terminal (a command typed runs, `stty size` follows a resize
// of the outer terminal, `exit 3` is the CLI's status), and `docker run
// -d -it` then `docker attach`; the detach keys, Ctrl-P Ctrl-Q, leave
// `docker run -it` and `docker attach` with the container running.
func testRunInteractive(t *testing.T, d dockerCLI, tag string) {
	t.Run("StdinOnce", func(t *testing.T) {
		d.t = t
		out, errOut, code := d.run("hi\n", "run", "-i", "--rm", "bash", "cat")
		if out != "hi\n" || code != 0 {
			t.Errorf("echo hi | docker run -i --rm bash cat: stdout %q, exit %d, stderr %q", out, code, errOut)
		}
		out, errOut, code = d.run("one\ntwo\n", "run", "-i", "--rm", "bash", "sh", "-c", "wc -l; echo err >&2; exit 4")
		if strings.TrimSpace(out) != "2" || !strings.Contains(errOut, "err\n") || code != 4 {
			t.Errorf("docker run -i, stdout and stderr: stdout %q, stderr %q, exit %d; want 2, err, 4", out, errOut, code)
		}
	})
	t.Run("RunTTY", func(t *testing.T) {
		d.t = t
		name := "tty-" + tag
		cmd := d.cmd("run", "-it", "--rm", "--name", name, "bash", "bash")
		startTerm(t, cmd, 33, 91).shellSession("docker run -it")
		if left := d.ok("ps", "-aq", "--filter", "name="+name); left != "" {
			t.Errorf("containers left after run -it --rm: %q", left)
		}
	})
	t.Run("DetachKeys", func(t *testing.T) {
		d.t = t
		name := "detach-" + tag
		defer d.run("", "rm", "-f", name)
		running := func(after string) {
			t.Helper()
			if out := d.ok("inspect", "-f", "{{.State.Running}}", name); out != "true\n" {
				t.Fatalf("after %s the container is not running: %q", after, out)
			}
		}
		// The CLI sees the keys itself and leaves the connection: its
		// stdin's end must neither stop the shell nor reach it as ^D.
		term := startTerm(t, d.cmd("run", "-it", "--name", name, "bash", "bash"), 24, 80)
		term.await("ready-7", term.poke("echo ready-$((3+4))"))
		fmt.Fprint(term.ptmx, "\x10\x11")
		if code := term.wait(); code != 0 {
			t.Errorf("docker run -it, Ctrl-P Ctrl-Q: the CLI exited %d, want 0", code)
		}
		running("docker run -it and Ctrl-P Ctrl-Q")
		term = startTerm(t, d.cmd("attach", name), 24, 80)
		term.await("again-8", term.poke("echo again-$((4+4))"))
		fmt.Fprint(term.ptmx, "\x10\x11")
		// The CLI's own way (against Docker too): it says "read escape
		// sequence" and exits 1.
		if code := term.wait(); code != 1 {
			t.Errorf("docker attach, Ctrl-P Ctrl-Q: the CLI exited %d, want its 1", code)
		}
		running("docker attach and Ctrl-P Ctrl-Q")
		term = startTerm(t, d.cmd("attach", "--detach-keys", "ctrl-x,x", name), 24, 80)
		term.await("third-9", term.poke("echo third-$((4+5))"))
		term.typeLine("exit 4")
		if code := term.wait(); code != 4 {
			t.Errorf("docker attach, exit 4: the CLI exited %d", code)
		}
	})
	t.Run("DetachedAttach", func(t *testing.T) {
		d.t = t
		id := strings.TrimSpace(d.ok("run", "-d", "-it", "bash", "bash"))
		defer d.run("", "rm", "-f", id)
		term := startTerm(t, d.cmd("attach", id), 24, 80)
		// What the task printed before is not shown again (its prompt
		// went to the first attach, none here): a line typed is seen.
		term.await("attached-2", term.poke("echo attached-$((1+1))"))
		term.typeLine("exit 5")
		if code := term.wait(); code != 5 {
			t.Errorf("docker attach, exit 5: the CLI exited %d", code)
		}
		if out := d.ok("inspect", "-f", "{{.State.ExitCode}} {{.Config.Tty}} {{.Config.OpenStdin}}", id); out != "5 true true\n" {
			t.Errorf("inspect: %q, want 5 true true", out)
		}
		_, errOut, code := d.run("", "attach", id)
		if code == 0 || !strings.Contains(errOut, "You cannot attach to a stopped container") {
			t.Errorf("docker attach of an exited container: exit %d, %q", code, errOut)
		}
	})
}

// term is a CLI run under a pseudo-terminal of the test's.
type term struct {
	t     *testing.T
	cmd   *exec.Cmd
	ptmx  *os.File
	lines chan string
}

func startTerm(t *testing.T, cmd *exec.Cmd, rows, cols uint16) *term {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	tm := &term{t: t, cmd: cmd, ptmx: ptmx, lines: make(chan string, 256)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = ptmx.Close()
		_ = cmd.Wait()
	})
	go func() {
		defer close(tm.lines)
		sc := bufio.NewScanner(ptmx)
		for sc.Scan() {
			tm.lines <- strings.TrimSpace(sc.Text())
		}
	}()
	return tm
}

func (tm *term) typeLine(line string) { fmt.Fprint(tm.ptmx, line+"\r") }

// shellSession is the interactive case both `docker run -it` and `stoke
// run -it` pass, in a terminal started at 33×91: a typed command runs with
// TERM set, `stty size` shows the outer terminal's size and follows its
// resize, and `exit 3` is the CLI's exit status. what names the CLI.
func (tm *term) shellSession(what string) {
	tm.t.Helper()
	tm.typeLine("echo $((6*7))-$TERM")
	tm.await("42-xterm", nil)
	// The first size is the CLI's at the start (an API 1.41 client sends
	// it after the start; SIGWINCH may come before it listens); then each
	// SIGWINCH (await's poke sends one) sends the outer terminal's.
	tm.await("33 91", tm.poke("stty size"))
	if err := pty.Setsize(tm.ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		tm.t.Fatal(err)
	}
	tm.await("40 120", tm.poke("stty size"))
	tm.typeLine("exit 3")
	if code := tm.wait(); code != 3 {
		tm.t.Errorf("%s, exit 3: the CLI exited %d", what, code)
	}
}

// poke returns what await calls until its line shows: SIGWINCH to the
// CLI (which sends its size again) and the line typed again.
func (tm *term) poke(line string) func() {
	return func() {
		_ = tm.cmd.Process.Signal(syscall.SIGWINCH)
		tm.typeLine(line)
	}
}

// await reads lines until one ends with want; poke, when set, is called
// at once and after each other line and every half second. The deadline
// only guards against a hang.
func (tm *term) await(want string, poke func()) {
	tm.t.Helper()
	deadline := time.After(60 * time.Second)
	again := time.NewTicker(500 * time.Millisecond)
	defer again.Stop()
	if poke != nil {
		poke()
	}
	for {
		select {
		case <-again.C:
			if poke != nil {
				poke()
			}
		case l, ok := <-tm.lines:
			if !ok {
				tm.t.Fatalf("the terminal ended before %q", want)
			}
			if strings.HasSuffix(l, want) {
				return
			}
		case <-deadline:
			tm.t.Fatalf("no %q on the terminal", want)
		}
	}
}

// wait waits for the CLI and returns its exit status.
func (tm *term) wait() int {
	tm.t.Helper()
	go func() {
		for range tm.lines { // the rest of the output, so that it never blocks
		}
	}()
	err := tm.cmd.Wait()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		tm.t.Fatalf("waiting for the CLI: %v", err)
	}
	return 0
}
