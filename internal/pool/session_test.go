package pool

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/syncbuf"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	executorv1 "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/shm"
	"stoke.dev/stoke/internal/store/sqlite"
)

// A Runtime Server killed with SIGKILL takes its whole session with it
// before PodGone: the warm shell of a Ready function and its background
// child, a task, the task's job in a process group of its own and its
// orphan, none of which the server can kill any more. The pod is replaced.
func TestKilledServerTakesItsSessionWithIt(t *testing.T) {
	h := newHarness(t, nil, bashRuntime("bash", 1, 2))
	a := h.expect(podsource.PodReady, "").Pod
	pid := serverPid(t, a)

	warmChild := registerFunction(t, a, "fn1",
		"sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > bg.pid\nhandle() { printf '%s' \"$1\"; }\n")
	pids := runTask(t, a, "task1", `set -m
sleep 1000 >/dev/null & job=$!
orphan=$(sh -c 'sleep 1000 >/dev/null 2>&1 & echo $!')
echo "$job $orphan" > pid.fifo
wait`)
	if len(pids) != 2 {
		t.Fatalf("task pids %v", pids)
	}
	if pgid, _ := syscall.Getpgid(pids[0]); pgid == pid {
		t.Fatalf("the task's job is in the server's group: the test would not show the session kill")
	}
	members, err := proc.SessionMembers(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(pids, warmChild) {
		if !slices.Contains(members, p) {
			t.Fatalf("pid %d is not in the pod's session %v", p, members)
		}
	}

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := h.expect(podsource.PodGone, podsource.ReasonExited)
	if gone.Pod.UID != a.UID {
		t.Fatalf("gone %s, want %s", gone.Pod.UID, a.UID)
	}
	// The fencing invariant: at PodGone nothing of the pod runs.
	for _, p := range members {
		if !dead(p) {
			t.Errorf("PodGone while %d of the pod's session still runs", p)
		}
	}
	if left, _ := proc.SessionMembers(pid); len(left) != 0 {
		t.Errorf("pod session members left at PodGone: %v", left)
	}
	b := h.expect(podsource.PodReady, "").Pod
	if b.UID == a.UID {
		t.Fatal("replacement reuses the UID")
	}
	checkHealth(t, b)
	if !strings.Contains(h.logs.String(), `"msg":"killed the pod's processes"`) {
		t.Error("the kill of the pod's processes was not logged")
	}
}

// A supervisor that starts on a data directory kills what is left of the
// sessions its predecessor recorded, and nothing else.
func TestRestartKillsLeftoverSessions(t *testing.T) {
	data := t.TempDir()
	left, leftPids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
	spared, sparedPids := startSession(t, `sleep 1000 >/dev/null & echo $!; echo ready; wait`)
	leftSess, err := proc.SessionOf(left.Pid())
	if err != nil {
		t.Fatal(err)
	}
	stale, err := proc.SessionOf(spared.Pid())
	if err != nil {
		t.Fatal(err)
	}
	stale.Start++ // a record of an earlier process that had this pid
	for name, text := range map[string]string{
		"bash-aaaaa": leftSess.String() + "\n",
		"bash-bbbbb": stale.String() + "\n",
		"bash-ccccc": "not a session\n",
	} {
		dir := filepath.Join(data, "pods", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, sidFile), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	h := newHarness(t, func(c *Config) { c.DataDir = data })
	h.stop() // Run has returned: its start-up is over

	select {
	case <-left.Done():
	case <-time.After(eventTimeout):
		t.Fatal("the recorded session's leader was not killed")
	}
	for _, p := range leftPids {
		if !dead(p) {
			t.Errorf("pid %d of the recorded session still runs", p)
		}
	}
	for _, p := range append([]int{spared.Pid()}, sparedPids...) {
		if dead(p) {
			t.Errorf("pid %d was killed through a record of a reused pid", p)
		}
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"msg":"killed processes left by an earlier pod"`) ||
		!strings.Contains(logs, `"pod":"bash-aaaaa"`) {
		t.Errorf("the kill was not logged:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"cannot read the session of an earlier pod","pod":"bash-ccccc"`) {
		t.Errorf("the bad record was not logged:\n%s", logs)
	}
	if entries, _ := os.ReadDir(filepath.Join(data, "pods")); len(entries) != 0 {
		t.Errorf("pod directories left: %v", entries)
	}
}

// When the supervisor's process is killed (SIGKILL, as `stoke up` may be),
// each Runtime Server gets SIGTERM from the kernel and drains: it kills
// its tasks' process groups, then — leading its session — whatever is left
// of the session, such as a job in a process group of its own, and exits.
// Nothing waits for the next supervisor, which starts cleanly.
func TestSupervisorDeathLeavesNothingOfThePods(t *testing.T) {
	data := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperDataEnv+"="+data, helperBinEnv+"="+stokeBin)
	helperLog := &syncbuf.Buffer{}
	helper.Stdout, helper.Stderr = w, helperLog
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = helper.Wait()
	}()
	defer func() {
		_ = helper.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("first supervisor's log:\n%s", helperLog.String())
		}
	}()

	if err := r.SetReadDeadline(time.Now().Add(eventTimeout)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		t.Fatalf("first supervisor's pod: %q %v", line, err)
	}
	pod := podsource.Pod{Name: "first", Addr: addr, WorkspaceRoot: filepath.Join(data, "runs")}
	pid := serverPid(t, pod)
	t.Cleanup(func() { _, _ = proc.KillSession(pid, 10*time.Second) }) // should the test fail
	pids := runTask(t, pod, "task1", `sleep 1000 >/dev/null & inGroup=$!
set -m
sleep 1000 >/dev/null & ownGroup=$!
echo "$inGroup $ownGroup" > pid.fifo
wait`)
	if len(pids) != 2 {
		t.Fatalf("task pids %v", pids)
	}
	inGroup, ownGroup := pids[0], pids[1]

	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	// The server's drain (--shutdown-grace 1s) ends the task's group, and
	// its session kill the job in a group of its own. Had the server died
	// without draining, the task's shell would have died by its own
	// parent-death signal and left both running.
	awaitDead(t, pid, inGroup, ownGroup)
	if left, _ := proc.SessionMembers(pid); len(left) != 0 {
		t.Errorf("the old pod's session still has %v", left)
	}

	h := newHarness(t, func(c *Config) { c.DataDir = data }, bashRuntime("bash", 1, 2))
	h.expect(podsource.PodReady, "") // a restart on the killed supervisor's data directory
}

// The helper process of TestSupervisorDeathLeavesNothingOfThePods
// is this test binary with these set: it runs a supervisor on the data
// directory with one bash pod.
const (
	helperDataEnv = "STOKE_POOL_TEST_SUPERVISOR_DATA"
	helperBinEnv  = "STOKE_POOL_TEST_SUPERVISOR_BIN"
)

// helperSupervisor runs a supervisor with one bash pod on data, prints
// "ready ADDR" for each ready pod, and runs until it is killed.
func helperSupervisor(data, bin string) int {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, data)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := st.Runtimes().Create(ctx, bashRuntime("bash", 1, 2)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sup, err := NewSupervisor(Config{
		Store:          st,
		DataDir:        data,
		Command:        func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(bin, args...) },
		Logger:         slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		HealthInterval: 100 * time.Millisecond,
		ShutdownGrace:  time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	events, _, _ := sup.Subscribe()
	go func() { _ = sup.Run(ctx) }() // until the test kills this process
	for ev := range events {
		if ev.Type == podsource.PodReady {
			fmt.Printf("ready %s\n", ev.Pod.Addr)
		}
	}
	return 1
}

// registerFunction registers a bash function in pod p, in a new working
// directory named id whose handler.sh is file; file writes the pid of a
// background child to bg.pid while it is sourced, which is returned.
func registerFunction(t *testing.T, p podsource.Pod, id, file string) int {
	t.Helper()
	wd := filepath.Join(p.WorkspaceRoot, id)
	if err := os.Mkdir(wd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wd, "handler.sh"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, p)
	resp, err := executorv1.NewFunctionRuntimeClient(conn).RegisterFunction(t.Context(), &executorv1.RegisterFunctionRequest{
		RunUid:              id,
		RegistrationAttempt: 1,
		WorkingDir:          wd,
		Handler:             "handler.handle",
		RegistrationDigest:  "sha256:" + strings.Repeat("0", 64),
	})
	if err != nil || resp.GetState() != executorv1.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("register: %v %v", resp, err)
	}
	b, err := os.ReadFile(filepath.Join(wd, "bg.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || dead(pid) {
		t.Fatalf("the handler file's child %q: %v", b, err)
	}
	return pid
}

// runTask starts a one-shot task in pod p that runs script with bash in a
// new working directory named id. The script writes pids, on one line, to
// the FIFO pid.fifo there; runTask returns them.
func runTask(t *testing.T, p podsource.Pod, id, script string) []int {
	t.Helper()
	wd := filepath.Join(p.WorkspaceRoot, id)
	if err := os.Mkdir(wd, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(wd, "pid.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(fifo, os.O_RDWR, 0) // O_RDWR: opening does not wait for a writer
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	_, err = executorv1.NewRuntimeClient(dial(t, p)).Execute(t.Context(), &executorv1.ExecuteRequest{
		Id:         id,
		Args:       []string{bash, "-c", script},
		WorkingDir: wd,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetReadDeadline(time.Now().Add(eventTimeout)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("read the task's pids: %v", err)
	}
	var pids []int
	for _, s := range strings.Fields(line) {
		pid, err := strconv.Atoi(s)
		if err != nil || dead(pid) {
			t.Fatalf("task pids %q: %v", line, err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// dial connects to pod p's socket for the rest of the test.
func dial(t *testing.T, p podsource.Pod) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startSession starts script with bash as the leader of a new session and
// returns it with the pids the script prints, one per line, up to a line
// "ready". What is left of the session is killed at the end of the test.
func startSession(t *testing.T, script string) (*proc.Process, []int) {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := proc.Start(cmd, proc.NewSession())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = proc.KillSession(p.Pid(), 10*time.Second)
		p.Kill(0)
	})
	rd := bufio.NewReader(out)
	var pids []int
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("read the script's pids: %v (after %v)", err, pids)
		}
		if line = strings.TrimSpace(line); line == "ready" {
			return p, pids
		}
		pid, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("script printed %q", line)
		}
		pids = append(pids, pid)
	}
}

// awaitDead waits, bounded, until none of pids runs.
func awaitDead(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for _, pid := range pids {
		for !dead(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs", pid)
			}
			time.Sleep(5 * time.Millisecond) // polling the kernel's process table
		}
	}
}

// procEntry is what the tests need from /proc/<pid>/stat.
type procEntry struct {
	state byte
	ppid  int
}

// readProcTable reads every process's state and parent.
func readProcTable() (map[int]procEntry, error) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	table := make(map[int]procEntry, len(dir))
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if e, ok := parseStat(b); ok {
			table[pid] = e
		}
	}
	return table, nil
}

// parseStat parses "pid (comm) state ppid ..."; comm may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (procEntry, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procEntry{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return procEntry{}, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procEntry{}, false
	}
	return procEntry{state: f[0][0], ppid: ppid}, true
}

// A supervisor that starts on a data directory removes the IPC directories
// on /dev/shm that its predecessor's pods recorded, and only those.
func TestRestartRemovesLeftoverIPCDirectories(t *testing.T) {
	data := t.TempDir()
	elsewhere := t.TempDir() // a forged record must not remove it
	records := map[string]string{"bash-bbbbb": elsewhere}
	var left string // a real leftover, where /dev/shm can hold one
	if shm.Usable() {
		var err error
		if left, err = os.MkdirTemp(shm.Root, ipcPrefix); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(left)
		if err := os.WriteFile(filepath.Join(left, "req.7"), []byte(`{"secret":1}`), 0o600); err != nil {
			t.Fatal(err)
		}
		records["bash-aaaaa"] = left
	}
	for name, recorded := range records {
		dir := filepath.Join(data, "pods", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ipcFile), []byte(recorded+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	h := newHarness(t, func(c *Config) { c.DataDir = data })
	h.stop()

	if left != "" {
		if _, err := os.Lstat(left); !os.IsNotExist(err) {
			t.Errorf("the recorded IPC directory %s is still there: %v", left, err)
		}
	}
	if _, err := os.Lstat(elsewhere); err != nil {
		t.Errorf("a directory outside %s was removed: %v", shm.Root, err)
	}
	if logs := h.logs.String(); !strings.Contains(logs, `"msg":"cannot remove the IPC directory of an earlier pod","pod":"bash-bbbbb"`) {
		t.Errorf("the forged record was not logged:\n%s", logs)
	}
}
