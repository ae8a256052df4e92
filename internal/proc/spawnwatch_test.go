package proc

import (
	"bufio"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseLastPid(t *testing.T) {
	for in, want := range map[string]int{
		"0.20 0.18 0.12 1/80 11206\n": 11206,
		"12.05 9.00 3.10 12/4000 7":   7,
		"0.00 0.00 0.00 1/1 \n":       -1,
		"":                            -1,
		"0.00 0.00 0.00 1/1 -4\n":     -1,
		"0.00 0.00 0.00 1/1 12x\n":    -1,
	} {
		if got := parseLastPid([]byte(in)); got != want {
			t.Errorf("parseLastPid(%q) = %d, want %d", in, got, want)
		}
	}
}

// The kernel's cursor moves on every process this one starts: a look
// after a fork never says unchanged.
func TestSpawnWatchSeesAFork(t *testing.T) {
	mark := -1
	if spawns.Unchanged(&mark) {
		t.Fatal("a first look says unchanged")
	}
	if mark < 0 {
		t.Fatalf("/proc/loadavg gave no pid (mark %d)", mark)
	}
	for range 3 {
		if err := exec.Command("true").Run(); err != nil {
			t.Fatal(err)
		}
		if spawns.Unchanged(&mark) {
			t.Fatal("unchanged after a fork")
		}
	}
}

// A watch that cannot read its file never says unchanged.
func TestSpawnWatchUnreadable(t *testing.T) {
	w := &SpawnWatch{look: func() int { return -1 }}
	mark := -1
	for range 2 {
		if w.Unchanged(&mark) {
			t.Fatal("unchanged without a cursor")
		}
	}
}

// fakeSpawns is a SpawnWatch over a cursor the test moves.
func fakeSpawns() (*SpawnWatch, *int) {
	cur := 100
	return &SpawnWatch{look: func() int { return cur }}, &cur
}

// KillExcept lists the children again only when the cursor moved (or
// keep is not what it returned last): with a cursor that stays, a child
// started since is not seen, which is what proves the listing skipped;
// once it moves, that child is killed.
func TestChildScannerSkipsOnlyWhenNothingWasStarted(t *testing.T) {
	cmd := exec.Command("bash", "-c", `while read -r _; do sleep 1000 & echo $!; done`)
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
	spawn := func() int {
		t.Helper()
		if _, err := in.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	sc, err := NewChildScanner(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	w, cur := fakeSpawns()
	sc.spawns = w

	kept := sc.KillExcept(sc.Children()) // lists: the first look
	if len(kept) != 0 {
		t.Fatalf("children before any call: %+v", kept)
	}
	hidden := spawn()
	if left := sc.KillExcept(kept); len(left) != 0 || !running(hidden) {
		t.Fatalf("with the cursor still, KillExcept listed the children (left %+v, %d running %v)", left, hidden, running(hidden))
	}
	// A keep that is not what it returned last is listed against.
	if left := sc.KillExcept([]Child{{Pid: hidden}}); len(left) != 0 {
		t.Fatalf("KillExcept kept a child by a record without its start time: %+v", left)
	}
	awaitStopped(t, hidden)

	seen := spawn()
	*cur++
	if left := sc.KillExcept(nil); len(left) != 0 {
		t.Fatalf("KillExcept = %+v", left)
	}
	awaitStopped(t, seen)
}

// End looks for orphans only when a process was created since its last
// look: with the cursor still, an orphan there already wakes no scan.
func TestEndLooksOnlyWhenSomethingWasStarted(t *testing.T) {
	r := testSubreaper(t)
	w, cur := fakeSpawns()
	r.spawns = w
	orphansOf(t, "sleep "+marker()+" </dev/null >/dev/null 2>&1 &\necho $!")
	r.Begin("a")
	r.End("a")
	if n := len(r.poke); n != 1 {
		t.Fatalf("the first End did not look (%d pokes)", n)
	}
	<-r.poke
	r.Begin("b")
	r.End("b")
	if n := len(r.poke); n != 0 {
		t.Fatalf("End looked with the cursor still (%d pokes)", n)
	}
	*cur++
	r.Begin("c")
	r.End("c")
	if n := len(r.poke); n != 1 {
		t.Fatalf("End did not look once the cursor moved (%d pokes)", n)
	}
}

// preadAll reads a children file longer than its first buffer whole: a
// read that fills the buffer is followed by another.
func TestPreadAllReadsPastAFullBuffer(t *testing.T) {
	const n = 40
	p, pids := startSession(t, `for i in $(seq `+strconv.Itoa(n)+`); do sleep 1000 & echo $!; done; echo ready; wait`)
	sc, err := NewChildScanner(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	b, err := preadAll(sc.children, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := parsePids(b)
	if len(got) != n || len(pids) != n {
		t.Fatalf("read %d pids of %d (%q)", len(got), len(pids), b)
	}
	slices.Sort(got)
	slices.Sort(pids)
	if !slices.Equal(got, pids) {
		t.Fatalf("read %v, want %v", got, pids)
	}
}
