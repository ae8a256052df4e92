package proc

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// KillChildrenInScope kills the children of a live process that carry the
// scope, and only those.
func TestKillChildrenInScope(t *testing.T) {
	// Two children in scope s1, one started with another scope; the
	// parent prints their pids and waits for them.
	cmd := exec.Command("bash", "-c", `sleep 300 & a=$!; sleep 300 & b=$!
STOKE_SCOPE=s2 sleep 300 & c=$!
echo "$a $b $c"; wait`)
	cmd.Env = []string{ScopeEnv + "=s1", "PATH=/usr/bin:/bin"}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(line) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	t.Cleanup(func() { _ = syscall.Kill(pids[2], syscall.SIGKILL) })
	// A child has its parent's environment until it has exec'd sleep.
	deadline := time.Now().Add(10 * time.Second)
	for scopeOf(pids[2]) != "s2" {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never got scope s2", pids[2])
		}
		time.Sleep(time.Millisecond) // polling the kernel's process table
	}

	if n := KillChildrenInScope(cmd.Process.Pid, "s3"); n != 0 {
		t.Fatalf("scope s3: killed %d, want 0", n)
	}
	if n := KillChildrenInScope(cmd.Process.Pid, "s1"); n != 2 {
		t.Fatalf("scope s1: killed %d, want 2", n)
	}
	awaitStopped(t, pids[0], pids[1])
	if !running(pids[2]) {
		t.Fatalf("pid %d of scope s2 was killed", pids[2])
	}
	if n := KillChildrenInScope(1<<22+1, "s1"); n != 0 { // no such process
		t.Fatalf("missing process: killed %d", n)
	}
}
