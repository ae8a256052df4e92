package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	rt "stoke.dev/stoke/internal/runtime"
)

// seenWriter records what is written and wakes those waiting for it.
type seenWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	wake chan struct{}
}

func newSeenWriter() *seenWriter { return &seenWriter{wake: make(chan struct{})} }

func (w *seenWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	close(w.wake)
	w.wake = make(chan struct{})
	return len(p), nil
}

func (w *seenWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// await waits until what was written from offset from on contains s, and
// returns the offset past it; 30 s only guards against a hang.
func (w *seenWriter) await(t *testing.T, from int, s string) int {
	t.Helper()
	guard := time.NewTimer(30 * time.Second)
	defer guard.Stop()
	for {
		w.mu.Lock()
		got, wake := w.buf.String(), w.wake
		w.mu.Unlock()
		if i := strings.Index(got[from:], s); i >= 0 {
			return from + i + len(s)
		}
		select {
		case <-wake:
		case <-guard.C:
			t.Fatalf("never saw %q; output: %q", s, got)
		}
	}
}

func attach(t *testing.T, f *fixture, req exec.Request) exec.Session {
	t.Helper()
	l := exec.NewLocal(exec.LocalConfig{Targets: rt.ExecTargets(f.tasks, nil)})
	t.Cleanup(l.Close)
	s, err := l.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestAttachStdin: a task started with stdin reads what an attach session
// writes, its output comes back on the session's stdout and stderr, and
// the session's EOF (StdinOnce) ends its stdin.
func TestAttachStdin(t *testing.T) {
	f := newFixture(t, nil)
	f.execute(t, &pb.ExecuteRequest{Id: "cat", Args: []string{"bash", "-c", "cat; echo done >&2; exit 4"}, Stdin: true})
	s := attach(t, f, exec.Request{RunUID: "cat", Attach: true, Stdin: true, StdinOnce: true})
	out, errOut := newSeenWriter(), newSeenWriter()
	exit, err := s.Stream(context.Background(), exec.Streams{Stdin: strings.NewReader("hello\n"), Stdout: out, Stderr: errOut})
	if err != nil || exit.Code != 4 {
		t.Fatalf("Stream = %+v, %v; want exit 4", exit, err)
	}
	if out.String() != "hello\n" || errOut.String() != "done\n" {
		t.Errorf("stdout %q, stderr %q; want hello, done", out.String(), errOut.String())
	}
	if st := f.wait(t, "cat"); st.ExitCode != 4 || st.Stdout != "hello\n" {
		t.Errorf("status: exit %d, stdout %q", st.ExitCode, st.Stdout)
	}
}

// TestAttachTTY: a task started on a terminal is interactive through an
// attach session: a command typed is run, `stty size` follows a resize,
// and `exit 3` ends the task and the session with 3.
func TestAttachTTY(t *testing.T) {
	f := newFixture(t, nil)
	f.execute(t, &pb.ExecuteRequest{Id: "sh", Args: []string{"bash", "--norc", "--noprofile", "-i"}, Tty: true})
	s := attach(t, f, exec.Request{RunUID: "sh", Attach: true, Stdin: true})
	in, stdin := io.Pipe()
	defer stdin.Close()
	out := newSeenWriter()
	type result struct {
		exit exec.Exit
		err  error
	}
	done := make(chan result, 1)
	go func() {
		exit, err := s.Stream(context.Background(), exec.Streams{Stdin: in, Stdout: out})
		done <- result{exit, err}
	}()
	type_ := func(line string) {
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	type_("echo $((6*7)) $TERM")
	at := out.await(t, 0, "42 xterm")
	type_("stty size")
	at = out.await(t, at, "24 80")
	if err := s.Resize(exec.TermSize{Width: 100, Height: 30}); err != nil {
		t.Fatal(err)
	}
	type_("stty size")
	out.await(t, at, "30 100")
	type_("exit 3")
	r := <-done
	if r.err != nil || r.exit.Code != 3 {
		t.Fatalf("Stream = %+v, %v; want exit 3", r.exit, r.err)
	}
	if st := f.wait(t, "sh"); st.ExitCode != 3 {
		t.Errorf("status: exit %d, want 3", st.ExitCode)
	}
}

// TestTTYSize: a task started on a terminal with tty_size starts at that
// size (Docker's ConsoleSize), without a resize; a size past 65535 is
// refused.
func TestTTYSize(t *testing.T) {
	f := newFixture(t, nil)
	f.execute(t, &pb.ExecuteRequest{Id: "size", Args: []string{"stty", "size"}, Tty: true, TtySize: &pb.TerminalSize{Width: 111, Height: 33}})
	if st := f.wait(t, "size"); st.ExitCode != 0 || strings.TrimSpace(st.Stdout) != "33 111" {
		t.Errorf("stty size: exit %d, %q; want 33 111", st.ExitCode, st.Stdout)
	}
	_, err := f.tasks.Execute(context.Background(), &pb.ExecuteRequest{Id: "huge", WorkingDir: f.work, Args: []string{"true"}, Tty: true, TtySize: &pb.TerminalSize{Width: 1 << 16, Height: 24}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "tty_size") {
		t.Errorf("tty_size 65536 wide: %v, want InvalidArgument naming tty_size", err)
	}
}

// TestAttachRefused: a task without stdin or terminal cannot be attached
// to, and an attach request carrying a command is refused.
func TestAttachRefused(t *testing.T) {
	f := newFixture(t, nil)
	f.execute(t, &pb.ExecuteRequest{Id: "plain", Args: []string{"sleep", "60"}})
	l := exec.NewLocal(exec.LocalConfig{Targets: rt.ExecTargets(f.tasks, nil)})
	defer l.Close()
	if _, err := l.Start(context.Background(), exec.Request{RunUID: "plain", Attach: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("attach to a task without stdin: %v, want FailedPrecondition", err)
	}
	if _, err := l.Start(context.Background(), exec.Request{RunUID: "plain", Attach: true, Command: []string{"true"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("attach with a command: %v, want InvalidArgument", err)
	}
	if _, err := f.tasks.Cancel(context.Background(), &pb.CancelRequest{Id: "plain"}); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "plain")
}
