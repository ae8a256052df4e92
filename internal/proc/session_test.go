package proc

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// running reports whether pid exists and is not a zombie (a zombie runs
// nothing; init may be slow to reap it, or never reap it).
func running(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.live()
}

// awaitStopped waits (bounded) until none of pids runs.
func awaitStopped(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still running", pid)
			}
			time.Sleep(time.Millisecond) // polling the kernel's process table
		}
	}
}

// startSession starts script with bash as the leader of a new session and
// returns it with the pids the script prints, one per line, up to a line
// "ready". Whatever the test leaves running is killed at its end.
func startSession(t *testing.T, script string, env ...string) (*Process, []int) {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(cmd, NewSession())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = KillSession(p.Pid(), 10*time.Second)
		p.Kill(0)
	})
	r := bufio.NewReader(out)
	var pids []int
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read the script's pids: %v (after %v)", err, pids)
		}
		line = strings.TrimSpace(line)
		if line == "ready" {
			return p, pids
		}
		pid, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("script printed %q", line)
		}
		pids = append(pids, pid)
	}
}

// weirdSleep copies sleep to a file whose name, and so the process's comm,
// holds spaces and parentheses and looks like the start of a zombie's stat
// line to a parser that stops at the first ')'.
func weirdSleep(t *testing.T) string {
	t.Helper()
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "x) Z 1 1 1 (")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestNewSessionLeadsSessionAndGroup(t *testing.T) {
	p, pids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
	if sid, err := unix.Getsid(p.Pid()); err != nil || sid != p.Pid() {
		t.Errorf("session %d (%v), want %d", sid, err, p.Pid())
	}
	if pgid, err := syscall.Getpgid(p.Pid()); err != nil || pgid != p.Pid() {
		t.Errorf("process group %d (%v), want %d", pgid, err, p.Pid())
	}
	s, err := SessionOf(p.Pid())
	if err != nil || s.ID != p.Pid() || s.Start == 0 {
		t.Fatalf("SessionOf = %+v, %v", s, err)
	}
	if s, err := SessionOf(pids[0]); err == nil {
		t.Errorf("SessionOf(%d), a member that does not lead the session = %+v", pids[0], s)
	}
}

func mustGetsid(t *testing.T) int {
	t.Helper()
	sid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// KillSession reaches every process of the session: background jobs in
// process groups of their own (job control), orphans reparented away from
// the session, processes with odd names; it spares other sessions.
func TestKillSessionReachesEveryProcess(t *testing.T) {
	weird := weirdSleep(t)
	p, pids := startSession(t, `
set -m
sleep 1000 >/dev/null & echo $!
sh -c 'sleep 1000 >/dev/null 2>&1 & echo $!'
"$WEIRD" 1000 >/dev/null & echo $!
echo ready
wait`, "WEIRD="+weird)
	other, otherPids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
	if len(pids) != 3 {
		t.Fatalf("pids %v", pids)
	}
	job, orphan, odd := pids[0], pids[1], pids[2]
	if pgid, _ := syscall.Getpgid(job); pgid == p.Pid() {
		t.Fatalf("job %d is in the leader's group: the test would not show the session kill", job)
	}
	awaitExec(t, odd, ") Z 1")
	// sh has exited before the script goes on: the orphan's parent is
	// now outside the session (init, or a subreaper).
	if ppid := parentOf(t, orphan); ppid == p.Pid() || slices.Contains(pids, ppid) {
		t.Fatalf("orphan %d has parent %d in the session", orphan, ppid)
	}
	members, err := SessionMembers(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range append([]int{p.Pid()}, pids...) {
		if !slices.Contains(members, pid) {
			t.Errorf("SessionMembers(%d) = %v, lacks %d", p.Pid(), members, pid)
		}
	}

	killed, err := KillSession(p.Pid(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if code := p.ExitCode(); code != 128+int(syscall.SIGKILL) {
		t.Errorf("leader exit code %d", code)
	}
	for _, pid := range append([]int{p.Pid()}, pids...) {
		if !slices.Contains(killed, pid) {
			t.Errorf("killed %v lacks %d", killed, pid)
		}
	}
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("pid %d runs after KillSession returned", pid)
		}
	}
	if left, _ := SessionMembers(p.Pid()); len(left) != 0 {
		t.Errorf("session members left: %v", left)
	}
	// The other session is untouched.
	for _, pid := range append([]int{other.Pid()}, otherPids...) {
		if !running(pid) {
			t.Errorf("pid %d of another session was killed", pid)
		}
	}
}

// awaitExec waits (bounded) until pid's comm contains name: the shell's
// fork has exec'd the program.
func awaitExec(t *testing.T, pid int, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), name) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("comm of %d is %q", pid, b)
		}
		time.Sleep(time.Millisecond) // polling the kernel's process table
	}
}

// parentOf returns pid's parent.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// Session.Kill kills a session whose leader still runs, and one whose
// leader is gone (members hold its ID), but not one whose recorded start
// time does not match the process now under that pid.
func TestSessionKill(t *testing.T) {
	t.Run("leader alive", func(t *testing.T) {
		p, pids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
		s, err := SessionOf(p.Pid())
		if err != nil {
			t.Fatal(err)
		}
		killed, err := s.Kill(10 * time.Second)
		if err != nil || !slices.Contains(killed, pids[0]) || !slices.Contains(killed, p.Pid()) {
			t.Fatalf("Kill = %v, %v", killed, err)
		}
		awaitStopped(t, pids...)
		<-p.Done()
	})
	t.Run("leader gone", func(t *testing.T) {
		p, pids := startSession(t, `sleep 1000 >/dev/null 2>&1 & echo $!; echo ready; wait`)
		s, err := SessionOf(p.Pid())
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.Done() // reaped: the pid is held only as the orphan's session ID
		if !running(pids[0]) {
			t.Fatal("the orphan did not outlive its leader")
		}
		killed, err := s.Kill(10 * time.Second)
		if err != nil || !slices.Equal(killed, pids) {
			t.Fatalf("Kill = %v, %v; want %v", killed, err, pids)
		}
		if running(pids[0]) {
			t.Error("orphan runs after Kill")
		}
	})
	t.Run("pid reused", func(t *testing.T) {
		p, pids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
		s, err := SessionOf(p.Pid())
		if err != nil {
			t.Fatal(err)
		}
		s.Start-- // as if the record were of an earlier process with this pid
		killed, err := s.Kill(10 * time.Second)
		if err != nil || len(killed) != 0 {
			t.Fatalf("Kill of a stale record = %v, %v", killed, err)
		}
		for _, pid := range append([]int{p.Pid()}, pids...) {
			if !running(pid) {
				t.Errorf("pid %d was killed through a stale record", pid)
			}
		}
	})
}

func TestKillSessionRefuses(t *testing.T) {
	for _, sid := range []int{-1, 0, 1, mustGetsid(t)} {
		if killed, err := KillSession(sid, time.Second); err == nil || len(killed) != 0 {
			t.Errorf("KillSession(%d) = %v, %v", sid, killed, err)
		}
	}
}

// A ParentDeathSignal reaches the child when the thread that started it
// ends, though the process lives on: the Go caveat the pool guards
// against by keeping that thread locked for the life of the pod.
func TestParentDeathSignalOnThreadExit(t *testing.T) {
	cmd := exec.Command("bash", "-c", `trap 'exit 42' TERM; echo ready; sleep 1000 & wait`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A goroutine locked to the main thread that exits wedges the thread
	// rather than ending it; while such a goroutine holds the main thread,
	// the next one runs on another.
	release := make(chan struct{})
	defer close(release)
	started := make(chan *Process, 1)
	var start func()
	start = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if unix.Gettid() == unix.Getpid() {
			go start()
			<-release
			runtime.UnlockOSThread()
			return
		}
		p, err := Start(cmd, ParentDeathSignal(syscall.SIGTERM))
		if err != nil {
			t.Error(err)
			started <- nil
			return
		}
		// The trap is set once the script says so; only then may the
		// thread end.
		if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
			t.Error(err)
		}
		started <- p
	}
	go start()
	p := <-started
	if p == nil {
		t.FailNow()
	}
	defer p.Kill(0)
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no parent-death signal after the starting thread ended")
	}
	if code := p.ExitCode(); code != 42 {
		t.Fatalf("exit code %d, want 42 (SIGTERM trapped)", code)
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		line string
		want stat
		ok   bool
	}{
		{"123 (bash) S 1 123 123 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0", stat{state: 'S', ppid: 1, sid: 123, start: 98765}, true},
		{"7 (x) Z 1 1 1 (y) S 1 7 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0", stat{state: 'S', ppid: 1, sid: 9, start: 555}, true},
		{"8 (a b) c) R 2 3 4 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0", stat{state: 'R', ppid: 2, sid: 4, start: 1}, true},
		// A whole line of Linux 6: the environment's bounds are fields 50 and 51.
		{"77 (sleep) S 70 77 70 0 -1 4194304 103 0 0 0 0 0 0 0 20 0 1 0 2261 8294400 256 18446744073709551615 94 95 96 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 97 98 99 140000000000100 140000000000200 140000000000300 140000000000400 0",
			stat{state: 'S', ppid: 70, sid: 70, start: 2261, envStart: 140000000000300, envEnd: 140000000000400}, true},
		{"77 (sleep) S 70 77 70 0 -1 4194304 103 0 0 0 0 0 0 0 20 0 1 0 2261 8294400 256 18446744073709551615 94 95 96 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 97 98 99 1 2 x 4 0", stat{}, false},
		{"9 (sleep) S 1 2", stat{}, false},
		{"9 sleep S 1 2 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0", stat{}, false},
		{"9 (sleep) S 1 2 x 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0", stat{}, false},
	}
	for _, tt := range tests {
		got, err := parseStat([]byte(tt.line))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, ok %v", tt.line, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseSession(t *testing.T) {
	s := Session{ID: 4242, Start: 987654321}
	if got, err := ParseSession(s.String() + "\n"); err != nil || got != s {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "12", "12 x", "x 12", "1 12", "0 5", "12 5 6"} {
		if got, err := ParseSession(bad); err == nil {
			t.Errorf("ParseSession(%q) = %+v", bad, got)
		}
	}
}

// A process that does not lead its session (this test, started from a
// shell or go test) must never kill the session it shares.
func TestKillRestOfOwnSessionSparesASessionItDoesNotLead(t *testing.T) {
	own, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if own == os.Getpid() {
		t.Fatal("the test process leads its session; this test needs one that does not")
	}
	killed, err := KillRestOfOwnSession(time.Second)
	if err != nil || len(killed) != 0 {
		t.Fatalf("KillRestOfOwnSession = %v, %v; want nothing done", killed, err)
	}
}
