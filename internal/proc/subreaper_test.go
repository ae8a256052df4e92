package proc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testSubreaper makes the test process a child subreaper for the test's
// length; at its end the orphans left are swept and the process is an
// ordinary parent again.
func testSubreaper(t *testing.T) *Subreaper {
	t.Helper()
	r, err := NewSubreaper(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
			t.Error(err)
		}
		if err := r.Sweep(10 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return r
}

// marker is a sleep duration no other process uses, for finding a test's
// processes.
func marker() string {
	return fmt.Sprintf("%d.%09d", 1000+os.Getpid()%1000, time.Now().Nanosecond())
}

// scopeEnvOf reads pid's ScopeEnv as a test sees it: "" until it has one.
func scopeEnvOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(ScopeEnv+"=")); ok {
			return string(v)
		}
	}
	return ""
}

// orphansOf starts script (in a session of its own, with env) and returns
// the pids it prints once it has been killed: they are then orphans, this
// process's children. (Had it exited by itself, os/exec could close its
// output before all of it was read.)
func orphansOf(t *testing.T, script string, env ...string) []int {
	t.Helper()
	p, pids := startSession(t, script+"\necho ready\nexec sleep 1000", env...)
	if err := unix.Kill(p.Pid(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	for _, pid := range pids {
		if ppid := parentOf(t, pid); ppid != os.Getpid() {
			t.Fatalf("%d has parent %d, not this subreaper %d", pid, ppid, os.Getpid())
		}
	}
	return pids
}

// attached returns the scope the Subreaper has attached orphan pid to.
func (r *Subreaper) attached(pid int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, pids := range r.scopes {
		if pids[pid] {
			return name
		}
	}
	return ""
}

// An orphan adopted while its environment names a live scope, which then
// execs into a scope that has ended (a process forked by a Bash function's
// child, whose memory holds the warm shell's scope until it execs the
// command that carries the call's), is killed: its scope is read again at
// every look, not taken once for good.
func TestSubreaperKillsAnOrphanThatExecsIntoAnEndedScope(t *testing.T) {
	r := testSubreaper(t)
	r.Begin("load")
	r.Begin("call")
	fifo := filepath.Join(t.TempDir(), "go")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 8
	m := marker()
	pids := orphansOf(t, `for i in $(seq `+strconv.Itoa(n)+`); do
	( read -r _ <"$F"; exec env `+ScopeEnv+`=call sleep `+m+` ) & echo $!
done`, ScopeEnv+"=load", "F="+fifo)
	r.scan(false)
	for _, pid := range pids {
		if s := r.attached(pid); s != "load" {
			t.Fatalf("orphan %d is attached to %q, want load", pid, s)
		}
	}
	// Held open for writing until every orphan has read its line.
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString(strings.Repeat("\n", n)); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		awaitExec(t, pid, "sleep")
	}
	r.End("call")
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("orphan %d of the ended scope %q runs on (attached to %q)", pid, scopeEnvOf(pid), r.attached(pid))
			}
			r.scan(false)
			time.Sleep(time.Millisecond) // polling the kernel's process table
		}
	}
}

// Orphans of a live scope that exec again and again, found while they
// do, are never taken for orphans of no scope, though their environment
// reads empty for a moment in each exec (a few per cent of reads here);
// once they have settled they are attached to their scope, and its end
// kills them.
func TestSubreaperWaitsForAWholeEnvironment(t *testing.T) {
	r := testSubreaper(t)
	r.Begin("live")
	const batches, n, execs = 2, 32, 30
	m := marker()
	chain := `i=$1; [ "$i" -gt 0 ] && exec sh -c "$CHAIN" chain $((i-1)); exec sleep ` + m
	var all []int
	looks := 0
	for range batches {
		pids := orphansOf(t, `for i in $(seq `+strconv.Itoa(n)+`); do
	( exec sh -c "$CHAIN" chain `+strconv.Itoa(execs)+` ) & echo $!
done`, ScopeEnv+"=live", "CHAIN="+chain)
		all = append(all, pids...)
		// Look as often as the machine allows while they exec.
		deadline := time.Now().Add(time.Minute)
		for {
			r.scan(false)
			looks++
			settled := 0
			for _, pid := range pids {
				if !running(pid) {
					t.Fatalf("orphan %d of the live scope was killed while it exec'd (look %d)", pid, looks)
				}
				if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); bytes.HasPrefix(b, []byte("sleep\x00"+m)) {
					settled++
				}
			}
			if settled == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the orphans did not finish their execs: %d of %d did", settled, n)
			}
		}
	}
	t.Logf("%d looks while %d orphans exec'd %d times each", looks, len(all), execs)
	r.scan(false)
	for _, pid := range all {
		if s := r.attached(pid); s != "live" {
			t.Fatalf("orphan %d is attached to %q, want live", pid, s)
		}
	}
	r.End("live")
	awaitStopped(t, all...)
}

// Many orphans are made while their scope ends, by shells that setsid and
// double-fork in a loop; the Subreaper runs as a Runtime Server runs it.
// Whatever reached it before the end or reaches it after, nothing of the
// scope is left once the shells' own groups are killed.
func TestSubreaperLeavesNothingOfAnEndedScope(t *testing.T) {
	r := testSubreaper(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = r.Run(ctx)
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	m := marker()
	for round := range 5 {
		scope := "stress." + strconv.Itoa(round)
		r.Begin(scope)
		var shells []*Process
		for range 4 {
			cmd := exec.Command("bash", "-c", `while :; do
	setsid sh -c 'exec sleep `+m+`' </dev/null >/dev/null 2>&1 &
	( sh -c 'sleep `+m+` & exec true' & )
	(setsid sh -c '( exec sleep `+m+` ) & exec true' &)
done`)
			cmd.Env = append(os.Environ(), ScopeEnv+"="+scope)
			p, err := Start(cmd)
			if err != nil {
				t.Fatal(err)
			}
			shells = append(shells, p)
		}
		awaitCount(t, m, func(n int) bool { return n >= 20 })
		// As a task ends: its group is killed, then its scope.
		for _, p := range shells {
			p.Kill(0)
		}
		r.End(scope)
		awaitCount(t, m, func(n int) bool { return n == 0 })
	}
}

// awaitCount polls /proc (outside state with no event) until the number of
// live processes whose arguments hold m is as wanted.
func awaitCount(t *testing.T, m string, want func(n int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := len(withArg(m))
		if want(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes with %s: not as wanted", n, m)
		}
		time.Sleep(time.Millisecond) // polling the kernel's process table
	}
}

// withArg returns the live processes that have an argument m.
func withArg(m string) []int {
	dir, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte("\x00"+m+"\x00")) {
			continue
		}
		if running(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// End wakes Run only when this process has a child it did not start: an
// invocation that left no orphan (nearly every one) wakes no goroutine.
func TestEndWakesRunOnlyForAnOrphan(t *testing.T) {
	r := testSubreaper(t)
	// A child of this process's own (tracked), alive through both Ends.
	cmd := exec.Command("sleep", marker())
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Kill(0)
		<-p.Done()
	}()
	r.Begin("none")
	r.End("none")
	if n := len(r.poke); n != 0 {
		t.Fatalf("End woke Run with no orphan (%d pokes)", n)
	}
	m := marker()
	orphansOf(t, "sleep "+m+" </dev/null >/dev/null 2>&1 &\necho $!")
	r.Begin("one")
	r.End("one")
	if n := len(r.poke); n != 1 {
		t.Fatalf("End did not wake Run with an orphan (%d pokes)", n)
	}
}

// A scope that adopts no orphan costs its Begin and End no allocation:
// every warm invocation of a Runtime Server has one.
func TestScopeWithoutOrphansAllocatesNothing(t *testing.T) {
	r := testSubreaper(t)
	r.Begin("warm")
	r.End("warm") // opens the children file once
	if n := testing.AllocsPerRun(100, func() {
		r.Begin("warm")
		r.End("warm")
	}); n != 0 {
		t.Fatalf("%v allocations per scope, want 0", n)
	}
}
