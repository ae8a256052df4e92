// Package exectest is the one suite every exec hop passes: the Runtime
// Server's local executor over gRPC, runtimed's hop, the gateway's
// WebSocket and, later, the Lambda reverse agent. A hop's test supplies an
// Executor and live Runs to exec into; the suite drives real bash,
// coreutils and a real PTY through it and makes the assertions.
package exectest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// Run is a live Run to exec into.
type Run struct {
	// UID and RegistrationID are what a Request names at this hop.
	UID, RegistrationID string
	// Dir is the Run's working directory; Env holds some of its variables
	// with their values.
	Dir string
	Env map[string]string
	// End finishes the Run (its sessions must end, their processes gone).
	End func(t *testing.T)
}

// Harness is one hop under test.
type Harness struct {
	Executor exec.Executor
	// Task starts a task Run that runs until it is ended.
	Task func(t *testing.T) Run
	// Signals reports whether the hop carries Session.Signal (the
	// Kubernetes WebSocket protocol has no signal channel); RequestEnv
	// whether it carries Request.Env (the HTTP endpoint does not).
	Signals, RequestEnv bool
	// Pids reports whether the hop carries the command's process ID
	// (Session.Pid: the executor.v1 stream does, the Kubernetes
	// WebSocket protocol does not, and reports 0).
	Pids bool
	// BigBytes is how much the backpressure test pipes through cat each
	// way (default 8 MiB).
	BigBytes int
	// Stall is how long its slow reader stalls at a time (default 1 s).
	Stall time.Duration
}

// Timeout bounds every wait of the suite on the machine under test.
const Timeout = 60 * time.Second

// Test runs the suite.
func Test(t *testing.T, h Harness) {
	if h.BigBytes == 0 {
		h.BigBytes = 8 << 20
	}
	if h.Stall == 0 {
		h.Stall = time.Second
	}
	t.Run("InteractiveTTY", func(t *testing.T) { testInteractive(t, h) })
	t.Run("StdinEOFAndSeparateStreams", func(t *testing.T) { testPipes(t, h) })
	t.Run("WorkingDirAndEnv", func(t *testing.T) { testDirEnv(t, h) })
	t.Run("MissingCommand", func(t *testing.T) { testMissing(t, h) })
	t.Run("Pid", func(t *testing.T) { testPid(t, h) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, h) })
	t.Run("SessionLimit", func(t *testing.T) { testLimit(t, h) })
	t.Run("EndsWithRun", func(t *testing.T) { testEndsWithRun(t, h) })
	t.Run("Backpressure", func(t *testing.T) { Backpressure(t, h) })
	if h.Signals {
		t.Run("Signal", func(t *testing.T) { testSignal(t, h) })
	}
}

// Collect runs one session to its end with stdin from in (nil: none).
func Collect(ctx context.Context, x exec.Executor, req exec.Request, in io.Reader) (stdout, stderr string, exit exec.Exit, err error) {
	req.Stdin = in != nil
	sess, err := x.Start(ctx, req)
	if err != nil {
		return "", "", exec.Exit{}, err
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	exit, err = sess.Stream(ctx, exec.Streams{Stdin: in, Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), exit, err
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// Marker returns a unique sleep duration: a command line to find in /proc.
func Marker() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("1000.%d", 1+int(b[0])<<16|int(b[1])<<8|int(b[2]))
}

// Processes returns the live processes whose command line contains marker.
func Processes(marker string) []int {
	dir, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// AwaitProcesses polls /proc (outside state with no event) until the
// processes with marker number want (0: gone), or fails.
func AwaitProcesses(t *testing.T, marker string, want func(n int) bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for {
		n := len(Processes(marker))
		if want(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes with %q: %d, not as wanted after %v", marker, n, Timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Screen is a terminal's output as it arrives, for expect-style waits.
type Screen struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

// NewScreen returns an empty Screen.
func NewScreen() *Screen { return &Screen{changed: make(chan struct{})} }

func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	close(s.changed)
	s.changed = make(chan struct{})
	return len(p), nil
}

// Expect waits until the output after the previous match holds want,
// consumes it up to the match and returns what came before want.
func (s *Screen) Expect(t *testing.T, want string) string {
	t.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		i := strings.Index(s.buf.String(), want)
		if i >= 0 {
			before := string(s.buf.Next(i + len(want))[:i])
			s.mu.Unlock()
			return before
		}
		changed, seen := s.changed, s.buf.String()
		s.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waiting for %q; the terminal shows %q", want, seen)
		}
	}
}

type result struct {
	exit exec.Exit
	err  error
}

func testInteractive(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	sess, err := h.Executor.Start(ctx, exec.Request{
		RunUID: run.UID, RegistrationID: run.RegistrationID, TTY: true, Stdin: true,
		Command: []string{"bash", "--norc", "--noprofile", "-i"}, Size: exec.TermSize{Width: 80, Height: 24},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	inR, inW := io.Pipe()
	defer inW.Close()
	screen := NewScreen()
	done := make(chan result, 1)
	go func() {
		exit, err := sess.Stream(ctx, exec.Streams{Stdin: inR, Stdout: screen})
		done <- result{exit, err}
	}()
	type_ := func(s string) {
		if _, err := io.WriteString(inW, s); err != nil {
			t.Fatalf("typing %q: %v", s, err)
		}
	}
	type_("echo $((6*7))\r")
	screen.Expect(t, "42\r\n")

	if err := sess.Resize(exec.TermSize{Width: 100, Height: 30}); err != nil {
		t.Fatal(err)
	}
	type_("stty size\r")
	screen.Expect(t, "30 100\r\n")

	marker := Marker()
	type_("sleep " + marker + "\r")
	AwaitProcesses(t, marker, func(n int) bool { return n == 1 })
	type_("\x03")
	AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
	type_("echo alive-$?\r")
	screen.Expect(t, "alive-130\r\n")

	type_("exit 3\r")
	r := <-done
	if r.err != nil || r.exit.Code != 3 {
		t.Fatalf("exit %+v, %v; want code 3", r.exit, r.err)
	}
}

func testPipes(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	in := bytes.Repeat([]byte("x"), 100_003)
	out, errOut, exit, err := Collect(ctx, h.Executor, exec.Request{
		RunUID: run.UID, RegistrationID: run.RegistrationID,
		Command: []string{"bash", "-c", "wc -c; echo to-stderr >&2; seq 1 20000 >&2; echo to-stdout"},
	}, bytes.NewReader(in))
	if err != nil || exit.Code != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	if out != "100003\nto-stdout\n" {
		t.Errorf("stdout %q", out)
	}
	var want strings.Builder
	want.WriteString("to-stderr\n")
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if errOut != want.String() {
		t.Errorf("stderr: %d bytes, want %d", len(errOut), want.Len())
	}
}

func testDirEnv(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	script := `pwd; echo "x=$EXTRA"; echo "outputs=${STOKE_OUTPUTS:-unset}"`
	for k := range run.Env {
		script += fmt.Sprintf(`; echo "%s=$%s"`, k, k)
	}
	req := exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"bash", "-c", script}}
	wantX := "x="
	if h.RequestEnv {
		req.Env, wantX = map[string]string{"EXTRA": "yes"}, "x=yes"
	}
	out, _, exit, err := Collect(ctx, h.Executor, req, nil)
	if err != nil || exit.Code != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 || lines[0] != run.Dir || lines[1] != wantX || lines[2] != "outputs=unset" {
		t.Fatalf("output %q; want the working directory %s, %s, outputs=unset", out, run.Dir, wantX)
	}
	for k, v := range run.Env {
		if !strings.Contains(out, k+"="+v+"\n") {
			t.Errorf("output %q lacks %s=%s", out, k, v)
		}
	}
}

// testPid: a session's Pid is its command's process ID, as the command
// sees it ($$), where the hop carries it; 0 where it does not.
func testPid(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	sess, err := h.Executor.Start(ctx, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"sh", "-c", "echo $$"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	pid := sess.Pid()
	var out bytes.Buffer
	if exit, err := sess.Stream(ctx, exec.Streams{Stdout: &out, Stderr: io.Discard}); err != nil || exit.Code != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	want := strings.TrimSpace(out.String())
	if !h.Pids {
		want = "0"
	}
	if strconv.Itoa(pid) != want {
		t.Errorf("Pid %d; the command's own is %s (the hop carries it: %v)", pid, strings.TrimSpace(out.String()), h.Pids)
	}
}

func testMissing(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		command string
		code    int
	}{{"no-such-command-stoke", 127}, {"/etc/hostname", 126}, {"./nope/missing", 127}} {
		_, errOut, exit, err := Collect(ctx, h.Executor, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{tc.command}}, nil)
		if err != nil || exit.Code != tc.code {
			t.Errorf("%s: exit %+v, %v; want %d", tc.command, exit, err, tc.code)
		}
		if !strings.Contains(errOut, tc.command) {
			t.Errorf("%s: stderr %q does not name it", tc.command, errOut)
		}
	}
}

func testBadInput(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		req  exec.Request
		want error
	}{
		{"EmptyCommand", exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID}, errdefs.ErrInvalidArgument},
		{"EmptyArgv0", exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{""}}, errdefs.ErrInvalidArgument},
		{"UnknownRun", exec.Request{RunUID: run.UID + "-nope", RegistrationID: run.RegistrationID, Command: []string{"true"}}, errdefs.ErrNotFound},
	} {
		_, _, _, err := Collect(ctx, h.Executor, tc.req, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The Run is untouched: a session still works.
	out, _, exit, err := Collect(ctx, h.Executor, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"echo", "ok"}}, nil)
	if err != nil || exit.Code != 0 || out != "ok\n" {
		t.Fatalf("after bad input: %q %+v %v", out, exit, err)
	}
	// A finished Run is refused.
	run.End(t)
	_, _, _, err = Collect(ctx, h.Executor, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"true"}}, nil)
	if !errors.Is(err, errdefs.ErrNotRunning) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("exec into a finished run: %v, want NotRunning or NotFound", err)
	}
}

func testLimit(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	marker := Marker()
	var open []exec.Session
	defer func() {
		for _, s := range open {
			_ = s.Close()
		}
	}()
	req := exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"sleep", marker}}
	for range 8 {
		s, err := h.Executor.Start(ctx, req)
		if err != nil {
			t.Fatalf("session %d: %v", len(open)+1, err)
		}
		open = append(open, s)
	}
	if s, err := h.Executor.Start(ctx, req); !errors.Is(err, errdefs.ErrResourceExhausted) {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("the ninth session: %v, want ResourceExhausted", err)
	}
	_ = open[0].Close()
	open = open[1:]
	AwaitProcesses(t, marker, func(n int) bool { return n == 7 })
	// A slot is free again once a session closed; the hop may learn of it
	// a moment later, so this polls.
	deadline := time.Now().Add(Timeout)
	for {
		s, err := h.Executor.Start(ctx, req)
		if err == nil {
			open = append(open, s)
			break
		}
		if !errors.Is(err, errdefs.ErrResourceExhausted) || time.Now().After(deadline) {
			t.Fatalf("after closing one: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, s := range open {
		_ = s.Close()
	}
	open = nil
	AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
}

func testEndsWithRun(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	marker := Marker()
	// A background job in a group of its own and an orphan: both are the
	// session's and go with it.
	sess, err := h.Executor.Start(ctx, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID,
		Command: []string{"bash", "-c", "set -m; sleep " + marker + " & (sleep " + marker + " &); echo up; sleep " + marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	screen := NewScreen()
	done := make(chan result, 1)
	go func() {
		exit, err := sess.Stream(ctx, exec.Streams{Stdout: screen, Stderr: io.Discard})
		done <- result{exit, err}
	}()
	screen.Expect(t, "up\n")
	AwaitProcesses(t, marker, func(n int) bool { return n == 3 })
	run.End(t)
	r := <-done
	if r.err == nil {
		t.Fatalf("the session outlived its run: exit %+v", r.exit)
	}
	if !errors.Is(r.err, errdefs.ErrNotRunning) {
		t.Errorf("session ended with %v, want NotRunning saying why", r.err)
	}
	AwaitProcesses(t, marker, func(n int) bool { return n == 0 })
}

func testSignal(t *testing.T, h Harness) {
	run := h.Task(t)
	ctx := ctxT(t)
	marker := Marker()
	sess, err := h.Executor.Start(ctx, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"sleep", marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	AwaitProcesses(t, marker, func(n int) bool { return n == 1 })
	if err := sess.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit, err := sess.Stream(ctx, exec.Streams{Stdout: io.Discard, Stderr: io.Discard})
	if err != nil || exit.Code != 128+int(syscall.SIGTERM) || exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("exit %+v, %v; want SIGTERM", exit, err)
	}
}

// stallingWriter hashes what it is given, stalling now and then as a slow
// reader does.
type stallingWriter struct {
	sum        io.Writer
	n, every   int
	stall      time.Duration
	stalls     int
	sinceStall int
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	w.sinceStall += len(p)
	if w.sinceStall >= w.every {
		w.sinceStall = 0
		w.stalls++
		time.Sleep(w.stall) // the slow reader under test, not synchronisation
	}
	w.n += len(p)
	return w.sum.Write(p)
}

// Backpressure pipes h.BigBytes through cat each way with a reader that
// stalls for h.Stall at a time, and checks that every byte came back in
// order.
func Backpressure(t *testing.T, h Harness) {
	if h.Stall == 0 {
		h.Stall = time.Second
	}
	run := h.Task(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*Timeout)
	defer cancel()
	sess, err := h.Executor.Start(ctx, exec.Request{RunUID: run.UID, RegistrationID: run.RegistrationID, Command: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	inHash, outHash := sha256.New(), sha256.New()
	in := io.TeeReader(io.LimitReader(rand.Reader, int64(h.BigBytes)), inHash)
	w := &stallingWriter{sum: outHash, every: h.BigBytes / 3, stall: h.Stall}
	exit, err := sess.Stream(ctx, exec.Streams{Stdin: in, Stdout: w, Stderr: io.Discard})
	if err != nil || exit.Code != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	if w.n != h.BigBytes || hex.EncodeToString(inHash.Sum(nil)) != hex.EncodeToString(outHash.Sum(nil)) {
		t.Fatalf("%d bytes came back of %d, or they differ", w.n, h.BigBytes)
	}
	if w.stalls < 2 {
		t.Errorf("the reader stalled %d times", w.stalls)
	}
}
