package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/pool"
	"stoke.dev/stoke/internal/testbin"
	stokeup "stoke.dev/stoke/internal/up"
)

// stokeUp is a running `stoke up` (see testbin.StartUp) with the helpers
// the tests here use to drive its HTTP API.
type stokeUp struct {
	*testbin.Up
}

// startUp runs `stoke up --data-dir dataDir --listen 127.0.0.1:0
// extra...`. If the test fails, the end of its log is printed; at the end
// of the test it is killed if still running, and so is any process left
// behind that refers to dataDir.
func startUp(t testing.TB, dataDir string, extra ...string) *stokeUp {
	t.Helper()
	up, err := testbin.StartUp(stokeBin, dataDir, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log := up.Log()
			t.Logf("stoke up (%s) log, last %d lines:\n%s", dataDir, len(log), strings.Join(log, "\n"))
		}
		if err := up.Close(); err != nil {
			t.Error(err)
		}
		// Whatever the test left behind (a failed test) goes too, by pid,
		// and so do the pods' directories on /dev/shm of a stoke up that
		// was killed and not restarted.
		for _, p := range processesUnder(dataDir) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		if err := pool.RemoveIPCDirs(dataDir); err != nil {
			t.Error(err)
		}
		// And the cgroups (containment auto) of one that was killed.
		if own, err := cgroup.Detect(); err == nil {
			if abs, err := filepath.Abs(dataDir); err == nil {
				if g, err := own.Within(filepath.Join(own.Path(), stokeup.CgroupName(abs))); err == nil {
					if err := g.Remove(); err != nil {
						t.Error(err)
					}
				}
			}
		}
	})
	return &stokeUp{Up: up}
}

// stop sends SIGTERM and asserts that stoke up exits 0 and leaves no
// process behind that refers to its data directory.
func (u *stokeUp) stop(t *testing.T) {
	t.Helper()
	if err := u.Stop(); err != nil {
		t.Error(err)
	}
	if left := awaitNoProcessesUnder(u.DataDir, 5*time.Second); len(left) > 0 {
		t.Errorf("processes left after stoke up stopped:\n%s", describeProcesses(left))
	}
}

// kill9 sends SIGKILL to the stoke up process alone (not its group) and
// returns once it is reaped.
func (u *stokeUp) kill9(t *testing.T) {
	t.Helper()
	if err := u.Kill9(); err != nil {
		t.Fatal(err)
	}
}

// do sends an authenticated request with a JSON body (none if body is
// nil) and returns the status and the response body.
func (u *stokeUp) do(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	status, b, err := u.request(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, b
}

// request is do for any goroutine: it returns its error.
func (u *stokeUp) request(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+u.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: reading the body: %w", method, path, err)
	}
	return resp.StatusCode, b, nil
}

// apiClient bounds every API request but the streams.
var apiClient = &http.Client{Timeout: 30 * time.Second}

// createRun creates run in namespace default and asserts 201.
func (u *stokeUp) createRun(t testing.TB, run *v1alpha1.Run) *v1alpha1.Run {
	t.Helper()
	status, body := u.do(t, http.MethodPost, "/v1/namespaces/default/runs", run)
	if status != http.StatusCreated {
		t.Fatalf("create run %s: %d %s", run.Name, status, body)
	}
	var created v1alpha1.Run
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatalf("create run %s: %v in %s", run.Name, err, body)
	}
	return &created
}

// getRun gets a Run of namespace default.
func (u *stokeUp) getRun(t testing.TB, name string) *v1alpha1.Run {
	t.Helper()
	status, body := u.do(t, http.MethodGet, "/v1/namespaces/default/runs/"+name, nil)
	if status != http.StatusOK {
		t.Fatalf("get run %s: %d %s", name, status, body)
	}
	var run v1alpha1.Run
	if err := json.Unmarshal(body, &run); err != nil {
		t.Fatalf("get run %s: %v in %s", name, err, body)
	}
	return &run
}

// newRun is a Run of namespace default with the API's type meta.
func newRun(name string, spec v1alpha1.RunSpec) *v1alpha1.Run {
	run := &v1alpha1.Run{Spec: spec}
	run.APIVersion = v1alpha1.GroupVersion.String()
	run.Kind = v1alpha1.KindRun
	run.Name, run.Namespace = name, "default"
	return run
}

// runEvent is one line of a Run watch.
type runEvent struct {
	at  time.Time
	typ string
	run *v1alpha1.Run
}

// runWatch follows GET /v1/namespaces/default/runs?watch=true and keeps
// the latest version of every Run it has seen.
type runWatch struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the stream has ended

	mu      sync.Mutex
	runs    map[string]*v1alpha1.Run
	history []runEvent
	endErr  error         // why the stream ended
	changed chan struct{} // poked after each event
}

// watchRuns opens a watch; it ends with the test, or with stop.
func (u *stokeUp) watchRuns(t testing.TB) *runWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL+"/v1/namespaces/default/runs?watch=true", nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+u.Token)
	resp, err := http.DefaultClient.Do(req) // a stream: no client timeout
	if err != nil {
		cancel()
		t.Fatalf("watch: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("watch: %d %s", resp.StatusCode, b)
	}
	w := &runWatch{cancel: cancel, done: make(chan struct{}), runs: map[string]*v1alpha1.Run{}, changed: make(chan struct{}, 1)}
	go func() {
		defer close(w.done)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			err := dec.Decode(&ev)
			if err == nil && ev.Type == "ERROR" {
				err = fmt.Errorf("watch error event: %s", ev.Object)
			}
			var run v1alpha1.Run
			if err == nil {
				err = json.Unmarshal(ev.Object, &run)
			}
			w.mu.Lock()
			if err != nil {
				w.endErr = err
				w.mu.Unlock()
				w.poke()
				return
			}
			if ev.Type == "DELETED" {
				delete(w.runs, run.Name)
			} else {
				w.runs[run.Name] = &run
			}
			w.history = append(w.history, runEvent{at: time.Now(), typ: ev.Type, run: &run})
			w.mu.Unlock()
			w.poke()
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *runWatch) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// stop ends the watch and waits for its goroutine.
func (w *runWatch) stop() {
	w.cancel()
	<-w.done
}

// until waits, at most timeout, for cond to hold on the Runs seen so far
// (by name; cond must not keep the map) and returns a copy of them.
func (w *runWatch) until(t testing.TB, timeout time.Duration, what string, cond func(runs map[string]*v1alpha1.Run) bool) map[string]*v1alpha1.Run {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		ok, endErr := cond(w.runs), w.endErr
		snapshot := make(map[string]*v1alpha1.Run, len(w.runs))
		for k, v := range w.runs {
			snapshot[k] = v
		}
		w.mu.Unlock()
		if ok {
			return snapshot
		}
		if endErr != nil {
			t.Fatalf("waiting for %s: the watch ended: %v\nruns: %s", what, endErr, phaseCounts(snapshot))
		}
		select {
		case <-w.changed:
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within %v\nruns: %s", what, timeout, phaseCounts(snapshot))
		}
	}
}

// events returns the events seen so far for the Run name.
func (w *runWatch) events(name string) []runEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var evs []runEvent
	for _, ev := range w.history {
		if ev.run.Name == name {
			evs = append(evs, ev)
		}
	}
	return evs
}

// phaseCounts counts Runs by phase.
func phaseCounts(runs map[string]*v1alpha1.Run) string {
	n := map[v1alpha1.Phase]int{}
	for _, r := range runs {
		n[r.Status.Phase]++
	}
	return fmt.Sprint(n)
}

// process is a live process seen in /proc.
type process struct {
	pid     int
	ppid    int
	pgid    int
	sid     int
	start   uint64 // clock ticks after boot: tells a reused pid apart
	cmdline []string
	cwd     string
}

// processes reads every live (not zombie) process from /proc. A process
// that exits while it is read is left out.
func processes() []process {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		panic(err) // no /proc: nothing here can work
	}
	self := os.Getpid()
	var ps []process
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == self {
			continue
		}
		p, ok := readProcess(pid)
		if ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// readProcess reads one process; ok is false if it is gone or a zombie.
func readProcess(pid int) (process, bool) {
	base := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(base + "/stat")
	if err != nil {
		return process{}, false
	}
	// "pid (comm) state ppid ...": comm may hold anything, so count from
	// the last ')'; the text after it starts with field 3.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return process{}, false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 20 || f[0][0] == 'Z' || f[0][0] == 'X' {
		return process{}, false
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	pgid, _ := strconv.Atoi(string(f[2]))
	sid, _ := strconv.Atoi(string(f[3]))
	start, _ := strconv.ParseUint(string(f[19]), 10, 64)
	p := process{pid: pid, ppid: ppid, pgid: pgid, sid: sid, start: start}
	if b, err := os.ReadFile(base + "/cmdline"); err == nil {
		p.cmdline = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	p.cwd, _ = os.Readlink(base + "/cwd")
	return p, true
}

// refersTo reports whether p's command line or working directory names
// dir or something under it.
func (p process) refersTo(dir string) bool {
	under := func(s string) bool { return s == dir || strings.HasPrefix(s, dir+"/") }
	if under(p.cwd) {
		return true
	}
	for _, a := range p.cmdline {
		if under(a) || strings.Contains(a, dir+"/") {
			return true
		}
	}
	return false
}

// processesUnder returns the live processes that refer to dir.
func processesUnder(dir string) []process {
	var ps []process
	for _, p := range processes() {
		if p.refersTo(dir) {
			ps = append(ps, p)
		}
	}
	return ps
}

// processesRunning returns a lister of the live processes whose command
// line is exactly argv.
func processesRunning(argv ...string) func() []process {
	return func() []process {
		var ps []process
		for _, p := range processes() {
			if slices.Equal(p.cmdline, argv) {
				ps = append(ps, p)
			}
		}
		return ps
	}
}

// awaitNoProcessesUnder polls /proc (there is no event for another
// process's death) until no live process refers to dir, for at most
// bound, and returns those still there.
func awaitNoProcessesUnder(dir string, bound time.Duration) []process {
	return awaitGone(bound, func() []process { return processesUnder(dir) })
}

// awaitGone polls list until it is empty or bound passes.
func awaitGone(bound time.Duration, list func() []process) []process {
	deadline := time.Now().Add(bound)
	for {
		left := list()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel's process table
	}
}

// awaitProcess polls /proc (there is no event for another process's
// start) until found reports true, for at most bound.
func awaitProcess(bound time.Duration, found func() bool) bool {
	deadline := time.Now().Add(bound)
	for !found() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel's process table
	}
	return true
}

// stillAlive reports which of ps still run (same pid, same start time).
func stillAlive(ps []process) []process {
	var left []process
	for _, p := range ps {
		if q, ok := readProcess(p.pid); ok && q.start == p.start {
			left = append(left, q)
		}
	}
	return left
}

// descendants returns the live processes descended from root.
func descendants(root int) []process {
	all := processes()
	children := map[int][]process{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []process
	queue := []int{root}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out
}

func describeProcesses(ps []process) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "  pid %d (ppid %d pgid %d sid %d) cwd %s: %q\n", p.pid, p.ppid, p.pgid, p.sid, p.cwd, p.cmdline)
	}
	return b.String()
}

// invokeResult is one invocation's outcome.
type invokeResult struct {
	status int
	header http.Header
	body   []byte
	err    error // transport error, the client timeout included
}

// invokeEndpoint POSTs body to a function's endpoint with a client timeout.
func invokeEndpoint(client *http.Client, token, endpoint, body string) invokeResult {
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return invokeResult{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return invokeResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return invokeResult{status: resp.StatusCode, header: resp.Header, err: err}
	}
	return invokeResult{status: resp.StatusCode, header: resp.Header, body: b}
}

// isTimeout reports whether err is a client timeout.
func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// awaitFIFO waits, at most bound, until something opens the FIFO at path
// for writing and writes a line to it.
func awaitFIFO(t *testing.T, path string, bound time.Duration) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		f, err := os.Open(path) // blocks until a writer opens it
		if err == nil {
			_, err = bufio.NewReader(f).ReadString('\n')
			f.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
	case <-time.After(bound):
		// Release the reader: an open for writing completes its open.
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-got
		t.Fatalf("nothing wrote to %s within %v", path, bound)
	}
}

// runsCanWrite returns a new directory that the Runs can write to whatever
// user they run as (a root stoke up runs them as an unprivileged one).
func runsCanWrite(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := testbin.RunsCanPass(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runsCanOpenFIFO makes a FIFO named name that the Runs can open whatever
// user they run as.
func runsCanOpenFIFO(t testing.TB, name string) string {
	t.Helper()
	fifo := filepath.Join(runsCanWrite(t), name)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	return fifo
}
