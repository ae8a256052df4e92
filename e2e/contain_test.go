package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cgroup"
)

// escapeBound is how long an escaped process may live on once what
// started it has ended: the Runtime Server finds a new orphan within a
// fraction of a second.
const escapeBound = 10 * time.Second

// withMarker returns the live processes whose arguments hold marker.
func withMarker(marker string) []process {
	var ps []process
	for _, p := range processes() {
		if strings.Contains(strings.Join(p.cmdline, " "), marker) {
			ps = append(ps, p)
		}
	}
	return ps
}

// sleeping returns the live `sleep marker` processes: not the shell whose
// script names marker, which withMarker finds too, before it has started
// anything.
func sleeping(marker string) []process {
	var ps []process
	for _, p := range processes() {
		if len(p.cmdline) == 2 && filepath.Base(p.cmdline[0]) == "sleep" && p.cmdline[1] == marker {
			ps = append(ps, p)
		}
	}
	return ps
}

// escaper is the shell that starts, in the background, a process which
// leaves its parent's session: it proves that it ran (a file named after
// its marker in dir), then becomes `sleep MARKER`. The shell goes on once
// that file exists.
func escaper(dir, marker string) string {
	f := filepath.Join(dir, marker)
	return fmt.Sprintf(`setsid sh -c 'touch %q; exec sleep %s' </dev/null >/dev/null 2>&1 & until [ -e %q ]; do sleep 0.01; done`, f, marker, f)
}

// assertGone asserts that the process with marker ran and is gone (or
// goes within escapeBound).
func assertGone(t *testing.T, dir, marker, what string) {
	t.Helper()
	if left := awaitGone(escapeBound, func() []process { return withMarker(marker) }); len(left) > 0 {
		t.Errorf("%s: the escaped process still runs %v later:\n%s", what, escapeBound, describeProcesses(left))
		for _, p := range left {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, marker)); err != nil {
		t.Errorf("%s: the escaping process never ran: %v", what, err)
	}
}

// A process a Run starts never outlives it, whatever it does: a task's
// `setsid sleep &` and a double-forked daemon die when the task ends; a
// Bash and a Python function's do when the call ends; a load-time daemon
// and a running task's escapee when `stoke up` stops cleanly; and an
// escapee of a task whose pod is killed with SIGKILL when the pod dies.
//
// It runs under each containment: auto (on a host that delegates a
// writable cgroup v2, such as this one, each pod and task in a cgroup of
// its own) and the child subreaper alone.
func TestUpLeavesNoEscapedProcess(t *testing.T) {
	for _, mode := range []string{"auto", "subreaper"} {
		t.Run(mode, func(t *testing.T) { testUpLeavesNoEscapedProcess(t, mode) })
	}
}

func testUpLeavesNoEscapedProcess(t *testing.T, mode string) {
	dir := t.TempDir()
	proof := runsCanWrite(t)
	u := startUp(t, dir, "--containment", mode)
	w := u.watchRuns(t)
	// A marker is a sleep duration no other process here uses.
	tag := fmt.Sprintf("%d%06d", os.Getpid(), time.Now().Nanosecond()/1000)
	marker := func(n int) string { return fmt.Sprintf("%d.%s", 300+n, tag) }
	t.Cleanup(func() {
		for _, p := range withMarker(tag) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	})

	// Tasks: setsid in the background, and a double fork, then exit 0.
	u.createRun(t, newRun("setsid-task", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", escaper(proof, marker(1)) + "; exit 0"}}}}))
	u.createRun(t, newRun("daemon-task", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", "( " + escaper(proof, marker(2)) + " ) ; exit 0"}}}}))
	runs := w.until(t, 60*time.Second, "both tasks to end", func(runs map[string]*v1alpha1.Run) bool {
		return runs["setsid-task"] != nil && runs["setsid-task"].Status.Phase.Terminal() &&
			runs["daemon-task"] != nil && runs["daemon-task"].Status.Phase.Terminal()
	})
	for _, name := range []string{"setsid-task", "daemon-task"} {
		if r := runs[name]; r.Status.Phase != v1alpha1.PhaseSucceeded {
			t.Errorf("%s: %s (%s: %s), want Succeeded", name, r.Status.Phase, r.Status.Reason, r.Status.Message)
		}
	}
	assertGone(t, proof, marker(1), "a task's setsid sleep &")
	assertGone(t, proof, marker(2), "a task's double-forked daemon")

	// Functions: each call starts escapers named by its input. The Bash
	// one also starts one when its file is loaded, which lives as long as
	// the function does.
	u.createRun(t, newRun("bashfn", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "h.sh", Text: escaper(proof, marker(6)) + "\n" +
			`handle() { m=${1#*\"m\":\"}; m=${m%%\"*}; setsid sh -c "touch $P/$m; exec sleep $m" </dev/null >/dev/null 2>&1 & until [ -e "$P/$m" ]; do sleep 0.01; done; printf '{}'; }` + "\n"}},
		Env: []v1alpha1.EnvVar{{Name: "P", Value: proof}}}))
	u.createRun(t, newRun("pyfn", v1alpha1.RunSpec{Runtime: "python",
		Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "m.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "m.py", Text: `import os, subprocess, time

def handle(event):
    p = os.environ["P"]
    # A child of the worker in a session of its own...
    subprocess.Popen(["setsid", "sh", "-c", f"touch {p}/{event['a']}; exec sleep {event['a']}"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # ...and an orphan, through a shell that exits at once.
    os.system(f"setsid sh -c 'touch {p}/{event['b']}; exec sleep {event['b']}' </dev/null >/dev/null 2>&1 &")
    for m in (event['a'], event['b']):
        while not os.path.exists(f"{p}/{m}"):
            time.sleep(0.01)
    return {}
`}},
		Env: []v1alpha1.EnvVar{{Name: "P", Value: proof}}}))
	runs = w.until(t, 60*time.Second, "both functions Ready", func(runs map[string]*v1alpha1.Run) bool {
		for _, name := range []string{"bashfn", "pyfn"} {
			if r := runs[name]; r == nil || r.Status.Phase != v1alpha1.PhaseReady && !r.Status.Phase.Terminal() {
				return false
			}
		}
		return true
	})
	client := &http.Client{Timeout: 30 * time.Second}
	invoke := func(name, body string) {
		t.Helper()
		r := runs[name]
		if r.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("%s: %s (%s: %s), want Ready", name, r.Status.Phase, r.Status.Reason, r.Status.Message)
		}
		if res := invokeEndpoint(client, u.Token, r.Status.Endpoint, body); res.err != nil || res.status != http.StatusOK {
			t.Fatalf("invoke %s %s: %d %s %v", name, body, res.status, res.body, res.err)
		}
	}
	for i, m := range []string{marker(3), marker(4)} {
		invoke("bashfn", fmt.Sprintf(`{"m":%q}`, m))
		assertGone(t, proof, m, fmt.Sprintf("Bash function call %d", i+1))
	}
	for i, m := range [][2]string{{marker(7), marker(8)}, {marker(9), marker(10)}} {
		invoke("pyfn", fmt.Sprintf(`{"a":%q,"b":%q}`, m[0], m[1]))
		assertGone(t, proof, m[0], fmt.Sprintf("Python function call %d: its setsid child", i+1))
		assertGone(t, proof, m[1], fmt.Sprintf("Python function call %d: its orphan", i+1))
	}
	if len(withMarker(marker(6))) != 1 {
		t.Errorf("the Bash function's load-time daemon does not run while the function is Ready")
	}

	// A pod killed with SIGKILL under a running task: the task's escapee
	// goes with the pod.
	u.createRun(t, newRun("victim", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", escaper(proof, marker(11)) + "; exec sleep " + marker(12)}}}}))
	if !awaitProcess(60*time.Second, func() bool { return len(sleeping(marker(11))) == 1 && len(sleeping(marker(12))) == 1 }) {
		t.Fatalf("the victim task's processes never ran")
	}
	// The task runs in the containment asked for.
	cg := cgroupOf(t, sleeping(marker(12))[0].pid)
	if inTask := taskCgroup.MatchString(cg); inTask != (mode == "auto" && cgroupUsable()) {
		t.Errorf("containment %s: the victim task's cgroup is %q", mode, cg)
	}
	server := 0
	for _, p := range descendants(u.Pid) {
		if len(p.cmdline) > 1 && p.cmdline[1] == "runtime-server" && slicesContainsPid(descendants(p.pid), sleeping(marker(12))[0].pid) {
			server = p.pid
		}
	}
	if server == 0 {
		t.Fatalf("no runtime server runs the victim task:\n%s", describeProcesses(descendants(u.Pid)))
	}
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if left := awaitGone(escapeBound, func() []process { return withMarker(marker(12)) }); len(left) > 0 {
		t.Errorf("a task of a pod killed with SIGKILL still runs:\n%s", describeProcesses(left))
	}
	assertGone(t, proof, marker(11), "the escapee of a task of a pod killed with SIGKILL")
	// The next task must not be placed on the dead pod before stoke up has
	// seen it die: the victim's end says it has.
	if r := w.until(t, 60*time.Second, "the victim ended with its pod", func(runs map[string]*v1alpha1.Run) bool {
		return runs["victim"] != nil && runs["victim"].Status.Phase.Terminal()
	})["victim"]; r.Status.Phase != v1alpha1.PhaseFailed || r.Status.Reason != "PodGone" {
		t.Errorf("the victim task of a pod killed with SIGKILL is %s (%s), want Failed (PodGone)", r.Status.Phase, r.Status.Reason)
	}

	// A clean stop: a running task's escapee and the load-time daemon go.
	u.createRun(t, newRun("long", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", escaper(proof, marker(5)) + "; exec sleep 600"}}}}))
	if !awaitProcess(60*time.Second, func() bool { return len(sleeping(marker(5))) == 1 }) {
		t.Fatalf("the long task's escapee never ran")
	}
	w.stop()
	u.stop(t)
	assertGone(t, proof, marker(5), "a running task's escapee at a clean stop")
	assertGone(t, proof, marker(6), "a function's load-time daemon at a clean stop")
}

// taskCgroup matches the cgroup v2 path of a task under stoke up's
// containment auto: <stoke up's>/stoke-<hash>/pod-<pod UID>/task_<ID>.
var taskCgroup = regexp.MustCompile(`/stoke-[0-9a-f]{16}/pod-[^/]+/task_[^/]+$`)

// cgroupOf returns pid's cgroup v2 path.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	p, err := cgroup.OwnPath(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cgroupUsable says whether this host lets the tests create a cgroup v2
// with cgroup.kill, as stoke up's containment auto needs.
func cgroupUsable() bool {
	_, err := cgroup.Detect()
	return err == nil
}

func slicesContainsPid(ps []process, pid int) bool {
	for _, p := range ps {
		if p.pid == pid {
			return true
		}
	}
	return false
}

// When a pod and stoke up are both killed with SIGKILL, an escapee of a
// running task is orphaned to init, out of reach of every subreaper; under
// containment auto it is still in the pod's cgroup, which the next stoke
// up on the data directory kills.
func TestUpKilledWithItsPodLeavesNoEscapedProcess(t *testing.T) {
	if !cgroupUsable() {
		t.Fatal("this host delegates no writable cgroup v2 with cgroup.kill; this test proves containment auto and needs one")
	}
	dir := t.TempDir()
	proof := runsCanWrite(t)
	u := startUp(t, dir, "--containment", "auto")
	tag := fmt.Sprintf("%d%06d", os.Getpid(), time.Now().Nanosecond()/1000)
	escapee, sleeper := "401."+tag, "402."+tag
	t.Cleanup(func() {
		for _, p := range withMarker(tag) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	})
	u.createRun(t, newRun("victim", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c", escaper(proof, escapee) + "; exec sleep " + sleeper}}}}))
	if !awaitProcess(60*time.Second, func() bool { return len(sleeping(escapee)) == 1 && len(sleeping(sleeper)) == 1 }) {
		t.Fatalf("the victim task's processes never ran")
	}
	server := 0
	for _, p := range descendants(u.Pid) {
		if len(p.cmdline) > 1 && p.cmdline[1] == "runtime-server" && slicesContainsPid(descendants(p.pid), sleeping(sleeper)[0].pid) {
			server = p.pid
		}
	}
	if server == 0 {
		t.Fatalf("no runtime server runs the victim task:\n%s", describeProcesses(descendants(u.Pid)))
	}
	// Both at once: neither lives to collect what the other leaves. stoke
	// up is stopped first, so that, a subreaper, it cannot adopt and kill
	// what the dead pod orphans before its own SIGKILL.
	if err := syscall.Kill(u.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	u.kill9(t)
	// The task itself dies with its server (its parent-death signal); the
	// escapee, in a session of its own and orphaned to init, does not.
	if left := awaitGone(escapeBound, func() []process { return withMarker(sleeper) }); len(left) > 0 {
		t.Errorf("the task of a pod killed with SIGKILL still runs:\n%s", describeProcesses(left))
	}
	left := sleeping(escapee)
	if len(left) != 1 {
		t.Fatalf("the escapee should have outlived both kills (nothing is left to kill it), found %d", len(left))
	}
	if cg := cgroupOf(t, left[0].pid); !taskCgroup.MatchString(cg) {
		t.Fatalf("the escapee is not in its task's cgroup: %q", cg)
	}

	// The next stoke up kills what the pods its predecessor recorded left.
	u2 := startUp(t, dir, "--containment", "auto")
	assertGone(t, proof, escapee, "the escapee of a task whose pod and stoke up were killed with SIGKILL, after a restart")
	u2.stop(t)
}
