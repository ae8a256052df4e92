package proc

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// waitGone waits until pid no longer exists (it may need reaping by init).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(time.Millisecond) // polling the kernel's process table
	}
}

func TestKillGroupReachesBackgroundChildren(t *testing.T) {
	for _, grace := range []time.Duration{0, 50 * time.Millisecond} {
		cmd := exec.Command("bash", "-c", `trap '' TERM; sleep 300 & echo $!; wait`)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p, err := Start(cmd)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		child, _ := strconv.Atoi(strings.TrimSpace(line))
		if pgid, _ := syscall.Getpgid(child); pgid != p.Pid() {
			t.Fatalf("child pgid %d, want the leader's %d", pgid, p.Pid())
		}
		p.Kill(grace)
		p.Kill(grace) // safe twice
		<-p.Done()
		if code := p.ExitCode(); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("exit code %d, want %d", code, 128+int(syscall.SIGKILL))
		}
		waitGone(t, child)
	}
}

func TestExitCode(t *testing.T) {
	p, err := Start(exec.Command("bash", "-c", "exit 7"))
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if p.ExitCode() != 7 || p.Err() == nil {
		t.Fatalf("exit code %d err %v", p.ExitCode(), p.Err())
	}
	p.Kill(time.Second) // after exit: a no-op
}
