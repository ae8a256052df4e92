package proc

import (
	"bufio"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// KillChildrenExcept kills the children that a call started, named by pid
// and start time, whatever they are (an exec'd program, a subshell that
// never execs, one in a session of its own), and spares those that ran
// before the call.
func TestKillChildrenExcept(t *testing.T) {
	cmd := exec.Command("bash", "-c", `sleep 1000 & echo $!; echo ready
read -r _
sleep 1000 & echo $!
(while :; do sleep 1; done) & echo $!
setsid sleep 1000 & echo $!
echo ready
wait`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill(0)
	r := bufio.NewReader(out)
	pids := func() []int {
		var pids []int
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("read the script's pids: %v", err)
			}
			if line = strings.TrimSpace(line); line == "ready" {
				return pids
			}
			pid, err := strconv.Atoi(line)
			if err != nil {
				t.Fatalf("script printed %q", line)
			}
			pids = append(pids, pid)
		}
	}
	before := pids()
	kept := Children(p.Pid())
	if len(kept) != 1 || kept[0].Pid != before[0] {
		t.Fatalf("Children = %+v, want %v", kept, before)
	}
	if _, err := in.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	call := pids()
	left := KillChildrenExcept(p.Pid(), kept)
	if !slices.Equal(left, kept) {
		t.Errorf("KillChildrenExcept = %+v, want %+v", left, kept)
	}
	awaitStopped(t, call...)
	if !running(before[0]) {
		t.Errorf("the child that ran before the call (%d) was killed", before[0])
	}
	// A child named by a pid and another start time is another process.
	stale := []Child{{Pid: before[0], start: kept[0].start + 1}}
	if left := KillChildrenExcept(p.Pid(), stale); len(left) != 0 {
		t.Errorf("KillChildrenExcept with a stale record = %+v", left)
	}
	awaitStopped(t, before[0])
}
