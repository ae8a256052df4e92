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
	t.Run("by path", func(t *testing.T) {
		testKillChildrenExcept(t, func(pid int) (func() []Child, func([]Child) []Child) {
			return func() []Child { return Children(pid) }, func(keep []Child) []Child { return KillChildrenExcept(pid, keep) }
		})
	})
	t.Run("scanner", func(t *testing.T) {
		testKillChildrenExcept(t, func(pid int) (func() []Child, func([]Child) []Child) {
			sc, err := NewChildScanner(pid)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sc.Close() })
			return sc.Children, sc.KillExcept
		})
	})
}

func testKillChildrenExcept(t *testing.T, lister func(pid int) (children func() []Child, killExcept func([]Child) []Child)) {
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
	children, killExcept := lister(p.Pid())
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
	kept := children()
	if len(kept) != 1 || kept[0].Pid != before[0] {
		t.Fatalf("Children = %+v, want %v", kept, before)
	}
	if _, err := in.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	call := pids()
	left := killExcept(kept)
	if !slices.Equal(left, kept) {
		t.Errorf("KillChildrenExcept = %+v, want %+v", left, kept)
	}
	awaitStopped(t, call...)
	if !running(before[0]) {
		t.Errorf("the child that ran before the call (%d) was killed", before[0])
	}
	// A child named by a pid and another start time is another process.
	stale := []Child{{Pid: before[0], start: kept[0].start + 1}}
	if left := killExcept(stale); len(left) != 0 {
		t.Errorf("KillChildrenExcept with a stale record = %+v", left)
	}
	awaitStopped(t, before[0])
}

// A ChildScanner finds the children of every thread: one started by a
// thread that still runs, and, once the process has one thread again,
// those whose thread has ended (which Linux hands to the main thread).
func TestChildScannerThreads(t *testing.T) {
	cmd := exec.Command("python3", "-c", `import subprocess, sys, threading
ev, printed = threading.Event(), threading.Event()
def spawn(stay):
    print(subprocess.Popen(["sleep", "1000"]).pid, flush=True)
    printed.set()
    if stay:
        ev.wait()
a = threading.Thread(target=spawn, args=(True,))
a.start()
printed.wait()
print("ready", flush=True)
sys.stdin.readline()
ev.set()
a.join()
b = threading.Thread(target=spawn, args=(False,))
b.start()
b.join()
print("ready", flush=True)
sys.stdin.readline()
`)
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
	sc, err := NewChildScanner(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	r := bufio.NewReader(out)
	var pids []int
	await := func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("read the script's pids: %v", err)
			}
			if line = strings.TrimSpace(line); line == "ready" {
				return
			}
			pid, err := strconv.Atoi(line)
			if err != nil {
				t.Fatalf("script printed %q", line)
			}
			pids = append(pids, pid)
		}
	}
	found := func() []int {
		var got []int
		for _, c := range sc.Children() {
			got = append(got, c.Pid)
		}
		slices.Sort(got)
		return got
	}
	await()
	if got := found(); !slices.Equal(got, pids) {
		t.Errorf("with a second thread: Children = %v, want %v", got, pids)
	}
	if _, err := in.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	await()
	slices.Sort(pids)
	if got := found(); !slices.Equal(got, pids) {
		t.Errorf("with one thread again: Children = %v, want %v", got, pids)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	if got := sc.Children(); got != nil {
		t.Errorf("after Close: Children = %v, want none", got)
	}
}
