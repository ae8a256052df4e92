package python

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

// spareEnv is what a Functions without a base env of its own hands
// KeepSpare: BaseEnv without the per-Run HOME and TMPDIR, with extra.
func spareEnv(extra map[string]string) []string {
	env := runtime.BaseEnv("", "")
	delete(env, "HOME")
	delete(env, "TMPDIR")
	return runtime.MergeEnv(env, extra)
}

// keepSpare returns an adapter keeping a spare for registrations with
// extra in their env, and a channel of the pids of the spares it makes.
// The spare is closed when the test ends.
func keepSpare(tb testing.TB, extra map[string]string) (*Adapter, <-chan int) {
	tb.Helper()
	a := New(Config{Interpreter: testInterpreter(tb), Spare: true})
	made := make(chan int, 16)
	a.spares.made = func(pid int) { made <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(extra)})
	tb.Cleanup(a.CloseSpare)
	return a, made
}

// waitForStartingSpares lets a registration wait for a starting spare as
// long as the test may take: a test of the handover to a spare that has
// only begun its start must not depend on that start ending within
// spareWait, which a loaded machine (CI's parallel packages) can exceed.
func waitForStartingSpares(t *testing.T) {
	old := spareWait
	spareWait = time.Minute
	t.Cleanup(func() { spareWait = old })
}

func nextSpare(tb testing.TB, made <-chan int) int {
	tb.Helper()
	select {
	case pid := <-made:
		return pid
	case <-time.After(30 * time.Second):
		tb.Fatal("no spare python worker was made")
		return 0
	}
}

// describe is a handler that answers what a handler sees of its process.
const describe = `import os, sys
print("imported", flush=True)
def handle(event, context):
    print("called", event, flush=True)
    return {"pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ),
            "path": sys.path, "argv": sys.argv, "run_uid": context.run_uid,
            "file": __file__, "flags": repr(sys.flags)}
`

type described struct {
	Pid    int               `json:"pid"`
	Cwd    string            `json:"cwd"`
	Env    map[string]string `json:"env"`
	Path   []string          `json:"path"`
	Argv   []string          `json:"argv"`
	RunUID string            `json:"run_uid"`
	File   string            `json:"file"`
	Flags  string            `json:"flags"`
}

func describeCall(tb testing.TB, inst *instance, rec *recorder, id string) described {
	tb.Helper()
	res, err := invoke(tb, inst, rec, id, `"x"`)
	if err != nil {
		tb.Fatal(err)
	}
	var d described
	if err := json.Unmarshal(res.Output, &d); err != nil {
		tb.Fatalf("%s: %v", res.Output, err)
	}
	return d
}

// A registration through the spare runs in the spare's process, with the
// working directory, environment, import path and handler that a worker
// started for it has; a new spare is made after the handover.
func TestSpareHandedOver(t *testing.T) {
	a, made := keepSpare(t, nil)
	pid := nextSpare(t, made)
	dir := writeHandlers(t, map[string]string{"fn/app.py": describe})
	env := map[string]string{"GREETING": "hello", "PATH": "/bin:/usr/bin"}
	spec := testSpec(t, dir, "fn.app.handle", nil, env)
	got := describeCall(t, loadSpec(t, a, spec), nil, "inv-1")
	if got.Pid != pid {
		t.Fatalf("handler ran in pid %d, not in the spare %d", got.Pid, pid)
	}
	again := nextSpare(t, made)
	if again == pid {
		t.Fatalf("the spare made after the handover is the same process %d", pid)
	}

	// The same registration on a worker of its own: what the handler sees
	// must be the same, but for the pid.
	fresh := describeCall(t, loadSpec(t, New(Config{Interpreter: testInterpreter(t)}), spec), nil, "inv-2")
	if fresh.Pid == again || fresh.Pid == pid {
		t.Fatalf("the fresh worker is a spare (%d)", fresh.Pid)
	}
	got.Pid, fresh.Pid = 0, 0
	if !maps.Equal(got.Env, fresh.Env) {
		t.Errorf("environment through the spare:\n%v\nstarted for it:\n%v", got.Env, fresh.Env)
	}
	got.Env, fresh.Env = nil, nil
	if fmt.Sprint(got) != fmt.Sprint(fresh) {
		t.Errorf("through the spare:\n%+v\nstarted for it:\n%+v", got, fresh)
	}
	if got.Cwd != dir || got.Env["GREETING"] != "" || got.RunUID != "run-test" || !strings.HasPrefix(got.File, dir) {
		t.Errorf("handler sees cwd %s, run_uid %q, file %s; want %s, run-test", got.Cwd, got.RunUID, got.File, dir)
	}
}

// A registration whose environment sets what Python reads at its start
// gets a worker of its own; the spare stays for the next one that fits.
func TestSpareBypassedForStartEnv(t *testing.T) {
	a, made := keepSpare(t, nil)
	pid := nextSpare(t, made)
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	for _, env := range []map[string]string{
		{"PYTHONPATH": t.TempDir()}, {"PYTHONUNBUFFERED": "1"}, {"PYTHONHASHSEED": "7"},
		{"LANG": "C"}, {"LC_ALL": "C.UTF-8"}, {"LC_CTYPE": "C.UTF-8"}, {"TZ": "UTC"},
	} {
		got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, env)), nil, "inv")
		if got.Pid == pid {
			t.Fatalf("env %v: handed to the spare, whose start-up did not have it", env)
		}
		for k, v := range env {
			if got.Env[k] != v {
				t.Errorf("env %v: the handler sees %s=%q", env, k, got.Env[k])
			}
		}
	}
	if got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil)), nil, "inv"); got.Pid != pid {
		t.Fatalf("a registration that fits started pid %d, not the spare %d", got.Pid, pid)
	}
}

// A spare whose start-up had what the registration has (PYTHONPATH with a
// sitecustomize here): what `site` printed is the registration's, as it
// is for a worker started for it, and so is what `site` set in the
// environment; the handler's output is filed under its invocation.
func TestSpareOutputAndSite(t *testing.T) {
	site := t.TempDir()
	if err := os.WriteFile(site+"/sitecustomize.py", []byte(
		"import os\nprint('site says hi', flush=True)\nos.environ['SET_BY_SITE'] = 'yes'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PYTHONPATH": site}
	a, made := keepSpare(t, env)
	pid := nextSpare(t, made)
	rec := newRecorder()
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	inst := loadSpec(t, a, testSpec(t, dir, "app.handle", rec, env))
	got := describeCall(t, inst, rec, "inv-1")
	if got.Pid != pid {
		t.Fatalf("handler ran in pid %d, not in the spare %d", got.Pid, pid)
	}
	if got.Env["SET_BY_SITE"] != "yes" || got.Env["PYTHONPATH"] != site {
		t.Errorf("env after the handover: SET_BY_SITE=%q PYTHONPATH=%q", got.Env["SET_BY_SITE"], got.Env["PYTHONPATH"])
	}
	_ = inst.Close() // all output filed
	var lines []string
	for _, r := range rec.output("stdout") {
		lines = append(lines, r.Attrs["invocation_id"]+":"+r.Attrs["line"])
	}
	want := []string{":site says hi", ":imported", "inv-1:called x"}
	if !slices.Equal(lines, want) {
		t.Errorf("stdout filed as %q, want %q", lines, want)
	}
}

// A spare that died, or that closes its pipes without taking the
// registration, is never handed over: the registration gets a worker of
// its own and loads.
func TestSpareBrokenFallsBack(t *testing.T) {
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	t.Run("Died", func(t *testing.T) {
		a, made := keepSpare(t, nil)
		pid := nextSpare(t, made)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid, 10*time.Second)
		if got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil)), nil, "inv"); got.Pid == pid {
			t.Fatal("handed to a dead spare")
		}
		nextSpare(t, made)
	})
	t.Run("ExitsBeforeHanded", func(t *testing.T) {
		a, made := keepSpare(t, nil)
		nextSpare(t, made)
		// A spare that is alive when taken but exits on its handover
		// without HANDED, as one that broke in `site` would.
		broken := New(Config{Interpreter: writeScript(t, "#!/bin/sh\nexec "+testInterpreter(t)+" -c 'import os; os.read(3, 4)'\n")})
		w, err := broken.startWorker("/", spareEnv(nil), nil, "")
		if err != nil {
			t.Fatal(err)
		}
		a.spares.mu.Lock()
		good := a.spares.cur
		a.spares.cur = &spare{worker: w, start: a.startEnv(spareEnv(nil)), endScope: func() {}}
		a.spares.mu.Unlock()
		good.kill()
		got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil)), nil, "inv")
		if got.Pid == w.p.Pid() {
			t.Fatal("handed to the broken spare")
		}
		if !isClosed(w.p.Done()) {
			t.Error("the broken spare is still running")
		}
	})
}

// The next spare is made after the handed-over worker's first invocation
// (a scale from zero's first answer), not while it is on its way.
func TestSpareRemadeAfterFirstInvocation(t *testing.T) {
	waitForStartingSpares(t)
	defer func(d time.Duration) { remakeAfter = d }(remakeAfter)
	remakeAfter = time.Hour
	a := New(Config{Interpreter: testInterpreter(t), Spare: true})
	started := make(chan int, 4)
	a.spares.started = func(pid int) { started <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(nil)})
	t.Cleanup(a.CloseSpare)
	pid := nextSpare(t, started)
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	inst := loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil))
	a.spares.mu.Lock()
	making := a.spares.making || a.spares.cur != nil
	a.spares.mu.Unlock()
	if making {
		t.Fatal("the next spare is made before the first invocation")
	}
	if got := describeCall(t, inst, nil, "inv"); got.Pid != pid {
		t.Fatalf("handler ran in pid %d, not in the spare %d", got.Pid, pid)
	}
	nextSpare(t, started)
}

// The next spare is not started as the first invocation returns, while
// its answer is still on its way out of the Runtime Server and the pod
// (a scale from zero's first answer), but answerLead later.
func TestSpareNotStartedBesideTheFirstAnswer(t *testing.T) {
	waitForStartingSpares(t)
	defer func(r, l time.Duration) { remakeAfter, answerLead = r, l }(remakeAfter, answerLead)
	remakeAfter, answerLead = time.Hour, time.Hour
	a := New(Config{Interpreter: testInterpreter(t), Spare: true})
	started := make(chan int, 4)
	a.spares.started = func(pid int) { started <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(nil)})
	t.Cleanup(a.CloseSpare)
	pid := nextSpare(t, started)
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	inst := loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil))
	if got := describeCall(t, inst, nil, "inv"); got.Pid != pid {
		t.Fatalf("handler ran in pid %d, not in the spare %d", got.Pid, pid)
	}
	a.spares.mu.Lock()
	making := a.spares.making || a.spares.cur != nil
	a.spares.mu.Unlock()
	if making {
		t.Fatal("the next spare is started as the first invocation returns")
	}
}

// A registration that comes while the spare is still starting waits for
// it rather than start an interpreter of its own beside it.
func TestSpareStartingIsWaitedFor(t *testing.T) {
	waitForStartingSpares(t)
	a := New(Config{Interpreter: testInterpreter(t), Spare: true})
	started := make(chan int, 4)
	a.spares.started = func(pid int) { started <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(nil)})
	t.Cleanup(a.CloseSpare)
	pid := nextSpare(t, started) // its start-up has only begun
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	if got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, nil)), nil, "inv"); got.Pid != pid {
		t.Fatalf("handler ran in pid %d, not in the starting spare %d", got.Pid, pid)
	}
}

// A spare stuck in its start-up (here its `site` writes more than a pipe
// holds before anyone reads it) is never ready, never handed over: the
// registration waits for it a bounded time (spareWait) and gets a worker
// of its own, whose output is read.
func TestSpareStuckIsNotHandedOver(t *testing.T) {
	site := t.TempDir()
	if err := os.WriteFile(site+"/sitecustomize.py", []byte("import sys\nsys.stdout.write('x' * 200000 + '\\n')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PYTHONPATH": site}
	a := New(Config{Interpreter: testInterpreter(t), Spare: true})
	started, made := make(chan int, 1), make(chan int, 1)
	a.spares.started = func(pid int) { started <- pid }
	a.spares.made = func(pid int) { made <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(env)})
	t.Cleanup(a.CloseSpare)
	pid := nextSpare(t, started)
	dir := writeHandlers(t, map[string]string{"app.py": describe})
	if got := describeCall(t, loadSpec(t, a, testSpec(t, dir, "app.handle", nil, env)), nil, "inv"); got.Pid == pid {
		t.Fatal("handed to the stuck spare")
	}
	select {
	case pid := <-made:
		t.Fatalf("the stuck spare %d was made ready", pid)
	default:
	}
}

func writeScript(tb testing.TB, text string) string {
	tb.Helper()
	path := tb.TempDir() + "/python"
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
		tb.Fatal(err)
	}
	return path
}

// CloseSpare kills the spare; so does the death of the process that keeps
// it (a Runtime Server killed with SIGKILL), here a child test process.
func TestSpareDiesWithItsServer(t *testing.T) {
	t.Run("CloseSpare", func(t *testing.T) {
		a, made := keepSpare(t, nil)
		pid := nextSpare(t, made)
		a.CloseSpare()
		waitGone(t, pid, 10*time.Second)
	})
	t.Run("ServerKilled", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "STOKE_TEST_SPARE_KEEPER=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		sc := bufio.NewScanner(out)
		pid := 0
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "spare "); ok {
				pid, _ = strconv.Atoi(v)
				break
			}
		}
		if pid == 0 {
			t.Fatalf("the keeper process named no spare: %v", sc.Err())
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("the spare %d is not running before its keeper is killed: %v", pid, err)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid, 10*time.Second)
	})
}

// spareKeeper is TestSpareDiesWithItsServer's child process (TestMain
// runs it): it keeps a spare, names it and waits to be killed.
func spareKeeper() {
	a := New(Config{Interpreter: "python3", Spare: true})
	made := make(chan int, 1)
	a.spares.made = func(pid int) { made <- pid }
	a.KeepSpare(runtime.SpareSpec{Env: spareEnv(nil)})
	fmt.Printf("spare %d\n", <-made)
	time.Sleep(time.Minute)
	os.Exit(1)
}
