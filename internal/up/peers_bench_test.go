package up_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime/python"
	"stoke.dev/stoke/internal/testbin"
)

// The Python invoke figure of issue 8: sequential invocations of one echo
// handler from this process over keep-alive HTTP, through a `stoke up`
// child process's gateway, through the floor of that path's shape
// (floor_bench_test.go) and, when the environment names their binaries,
// through the peers docs/benchmarks.md describes, measured in alternating
// rounds of the same run. Every target runs the same handler module with
// the same interpreter.

// echoModule is the handler every target runs.
const echoModule = "def handle(event):\n    return event\n"

// benchInput is the request body every target gets (the actionloop proxy's
// wraps it in {"value": …}, as OpenWhisk does).
const benchInput = `{"command":"status"}`

// actionloopLauncher is the actionloop protocol's Python side, as
// openwhisk-runtime-python's launcher does it: one JSON line in on stdin,
// the handler's result as one JSON line out on fd 3. %[1]s is the
// interpreter, %[2]q the directory holding echo.py.
const actionloopLauncher = `#!%[1]s -s
import sys, os, json
sys.path.insert(0, %[2]q)
from echo import handle
out = os.fdopen(3, "wb")
env = os.environ
while True:
    line = sys.stdin.readline()
    if not line:
        break
    args = json.loads(line)
    payload = {}
    for key in args:
        if key == "value":
            payload = args["value"]
        else:
            env["__OW_%%s" %% key.upper()] = args[key]
    res = handle(payload)
    out.write(json.dumps(res, ensure_ascii=False).encode("utf-8"))
    out.write(b"\n")
    sys.stdout.flush()
    sys.stderr.flush()
    out.flush()
`

// rieBootstrap is a Lambda custom runtime: the Runtime API's next/response
// loop over one keep-alive connection. %[1]q is the directory holding
// echo.py.
const rieBootstrap = `import sys, os, json, http.client
sys.path.insert(0, %[1]q)
from echo import handle
conn = http.client.HTTPConnection(os.environ["AWS_LAMBDA_RUNTIME_API"])
while True:
    conn.request("GET", "/2018-06-01/runtime/invocation/next")
    r = conn.getresponse()
    event = json.loads(r.read())
    rid = r.getheader("Lambda-Runtime-Aws-Request-Id")
    body = json.dumps(handle(event)).encode("utf-8")
    conn.request("POST", "/2018-06-01/runtime/invocation/%%s/response" %% rid, body, {"Content-Type": "application/json"})
    conn.getresponse().read()
`

// invokeTarget is one thing the benchmark invokes.
type invokeTarget struct {
	name   string
	url    string
	body   string
	header http.Header
	client *http.Client
	// root is the process that serves the target's HTTP; its
	// descendants' CPU time and context switches are counted per call,
	// each under the role roleOf gives it.
	root   int
	roleOf func(cmdline string, isRoot bool) string
	lat    []time.Duration
	p50s   []float64 // per round, ms
	cpu    map[string]time.Duration
	sw     map[string]int64
}

func (t *invokeTarget) call(b *testing.B) {
	req, err := http.NewRequest(http.MethodPost, t.url, strings.NewReader(t.body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header = t.header.Clone()
	resp, err := t.client.Do(req)
	if err != nil {
		b.Fatalf("%s: %v", t.name, err)
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"status"`)) {
		b.Fatalf("%s: %d %q %v", t.name, resp.StatusCode, out, err)
	}
}

// peerRole is the role of a peer's processes: its own, and the Python
// process it started.
func peerRole(_ string, isRoot bool) string {
	if isRoot {
		return "server"
	}
	return "worker"
}

// stokeRole tells stoke up (the gateway and runtimed) from its pods and
// their workers.
func stokeRole(cmdline string, isRoot bool) string {
	switch {
	case isRoot:
		return "server"
	case strings.Contains(cmdline, "runtime-server"):
		return "pod"
	default:
		return "worker"
	}
}

// BenchmarkUpInvokePeers runs b.N calls per target, in rounds of
// roundCalls calls (STOKE_BENCH_ROUNDS sets their number instead) whose
// order of targets rotates, and reports each target's p50 and p99 over
// all its calls, the range of its per-round p50s, its p50 over the
// floor's (the figure of issue 20), and the CPU time and voluntary
// context switches per call of each of its processes' roles (server:
// stoke up, the floor's front or the peer; pod: Stoke's Runtime Servers
// or the floor's back; worker: the Python processes). On a busy machine
// those two move far less than latency. STOKE_BENCH_ACTIONLOOP and
// STOKE_BENCH_RIE name the peers' binaries; without them Stoke is
// measured beside its floor alone.
func BenchmarkUpInvokePeers(b *testing.B) { benchInvokePeers(b, 0) }

// BenchmarkUpInvokePaced is BenchmarkUpInvokePeers with one call started
// every 10 ms (a call that takes longer starts the next at once): the
// warm path as a lightly loaded function sees it, with the processes
// idle between calls.
func BenchmarkUpInvokePaced(b *testing.B) { benchInvokePeers(b, 10*time.Millisecond) }

// roundCalls is how many calls a target gets before the next target's
// turn: short rounds (tens of milliseconds back to back) so that the
// host's speed, which moves several-fold within an hour here and in
// bursts of other work within seconds, lands on every target alike and
// not on the ratio of their p50s.
const roundCalls = 100

func benchInvokePeers(b *testing.B, pace time.Duration) {
	interp, err := python.ResolveInterpreter(context.Background(), "")
	if err != nil {
		b.Fatal(err)
	}
	handlerDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(handlerDir, "echo.py"), []byte(echoModule), 0o644); err != nil {
		b.Fatal(err)
	}

	u, err := testbin.StartUp(stokeBin, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := u.Stop(); err != nil {
			b.Error(err)
		}
	})
	s := &server{url: u.URL, token: u.Token, client: &http.Client{Transport: &http.Transport{}}}
	defer s.client.CloseIdleConnections()
	fn := s.create(b, fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: echo-py}
spec:
  runtime: python
  mode: {function: {handler: echo.handle}}
  source: {inline: {path: echo.py, text: %q}}
`, echoModule))
	fn = s.waitPhase(b, fn.Name, v1alpha1.PhaseReady)
	// A Function of one replica, through its stable URL (the dispatcher's
	// lease and queue on the path).
	replica := s.create(b, fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: echo-fn-0, labels: {%s: echo-fn}}
spec:
  runtime: python
  mode: {function: {handler: echo.handle}}
  source: {inline: {path: echo.py, text: %q}}
`, v1alpha1.LabelFunction, echoModule))
	s.waitPhase(b, replica.Name, v1alpha1.PhaseReady)
	auth := http.Header{"Authorization": {"Bearer " + u.Token}, "Content-Type": {"application/json"}}
	targets := []*invokeTarget{{
		name: "stoke", url: fn.Status.Endpoint, body: benchInput, header: auth,
		root: u.Pid, roleOf: stokeRole,
	}, {
		name: "stoke-fn", url: u.URL + "/v1/namespaces/default/functions/echo-fn/invoke", body: benchInput, header: auth,
		root: u.Pid, roleOf: stokeRole,
	}}
	targets = append(targets, startFloor(b, interp, handlerDir))
	if bin := os.Getenv("STOKE_BENCH_ACTIONLOOP"); bin != "" {
		targets = append(targets, startActionloop(b, bin, interp, handlerDir))
	}
	if bin := os.Getenv("STOKE_BENCH_RIE"); bin != "" {
		targets = append(targets, startRIE(b, bin, interp, handlerDir))
	}
	rounds := max(1, b.N/roundCalls)
	if v, err := strconv.Atoi(os.Getenv("STOKE_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	perRound := max(1, b.N/rounds)
	for _, t := range targets {
		t.client = &http.Client{Transport: &http.Transport{}}
		defer t.client.CloseIdleConnections()
		for range 50 {
			t.call(b)
		}
		t.lat = make([]time.Duration, 0, perRound*rounds)
		t.cpu, t.sw = map[string]time.Duration{}, map[string]int64{}
	}
	// The warm-up's first call hands the registration's worker over, and
	// the pod then makes its next spare worker (an interpreter's start,
	// tens of ms of CPU, once per registration: runtime-server.md): wait
	// for it, so that the rounds time the warm path and not that start
	// landing on whichever target's round it falls in.
	awaitIdleSpares(b)
	b.ResetTimer()
	for r := range rounds {
		for k := range targets {
			t := targets[(r+k)%len(targets)]
			round := make([]time.Duration, 0, perRound)
			before := processUsage(b, t.root, t.roleOf)
			next := time.Now()
			for range perRound {
				if pace > 0 {
					time.Sleep(time.Until(next)) // the pace itself, not a wait for an event
				}
				start := time.Now()
				next = start.Add(pace)
				t.call(b)
				round = append(round, time.Since(start))
			}
			after := processUsage(b, t.root, t.roleOf)
			for role, a := range after {
				t.cpu[role] += a.cpu - before[role].cpu
				t.sw[role] += a.switches - before[role].switches
			}
			t.lat = append(t.lat, round...)
			t.p50s = append(t.p50s, percentile(round, 0.5))
		}
	}
	b.StopTimer()
	var floorP50 float64
	for _, t := range targets {
		if t.name == "floor" {
			floorP50 = percentile(t.lat, 0.5)
		}
	}
	for _, t := range targets {
		calls := float64(len(t.lat))
		p50 := percentile(t.lat, 0.5)
		b.ReportMetric(p50, t.name+"-p50-ms")
		if t.name != "floor" && floorP50 > 0 {
			b.ReportMetric(p50/floorP50, t.name+"-p50/floor")
		}
		b.ReportMetric(percentile(t.lat, 0.99), t.name+"-p99-ms")
		b.ReportMetric(slices.Min(t.p50s), t.name+"-p50-lo-ms")
		b.ReportMetric(slices.Max(t.p50s), t.name+"-p50-hi-ms")
		for role, cpu := range t.cpu {
			b.ReportMetric(float64(cpu.Microseconds())/1000/calls, t.name+"-"+role+"-cpu-ms/call")
			b.ReportMetric(float64(t.sw[role])/calls, t.name+"-"+role+"-switches/call")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// usage is the CPU time and voluntary context switches of processes.
type usage struct {
	cpu      time.Duration
	switches int64
}

// processUsage sums, by role, the usage of root and its descendants from
// /proc: CPU time from each process's stat (exited threads included),
// voluntary context switches from each of its threads' status.
func processUsage(b *testing.B, root int, roleOf func(cmdline string, isRoot bool) string) map[string]usage {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	parent := map[int]int{}
	cpu := map[int]time.Duration{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// Fields after the command name, which may hold spaces: state,
		// ppid, ..., utime and stime are the 12th and 13th.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		parent[pid], _ = strconv.Atoi(f[1])
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		cpu[pid] = time.Duration(utime+stime) * time.Second / clockTicks
	}
	out := map[string]usage{}
	for pid := range parent {
		p := pid
		for p > 1 && p != root {
			p = parent[p]
		}
		if p != root {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		role := roleOf(string(cmdline), pid == root)
		u := out[role]
		u.cpu += cpu[pid]
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
			for line := range strings.Lines(string(status)) {
				if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					u.switches += n
				}
			}
		}
		out[role] = u
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// percentile returns the q-quantile of lat in milliseconds; it sorts lat.
func percentile(lat []time.Duration, q float64) float64 {
	slices.Sort(lat)
	return float64(lat[int(float64(len(lat)-1)*q)].Microseconds()) / 1000
}

// startPeer starts a peer's process in its own session, killed with its
// whole process group when the benchmark ends, and returns its pid. Its
// stdout goes to cmd.Stdout if set, its stderr nowhere.
func startPeer(b *testing.B, cmd *exec.Cmd) int {
	if cmd.Stdout == nil {
		cmd.Stdout = io.Discard
	}
	cmd.Stderr = io.Discard
	p, err := proc.Start(cmd, proc.NewSession())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		p.Kill(0)
		<-p.Done()
	})
	return p.Pid()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(b *testing.B) int {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// awaitHTTP polls url until it answers at all: the peers say nothing when
// they listen.
func awaitHTTP(b *testing.B, name, url string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s does not answer at %s: %v", name, url, err)
		}
		time.Sleep(20 * time.Millisecond) // outside state with no event to await
	}
}

// actionloopAddr is where the actionloop proxy listens: its port is fixed,
// and docs/benchmarks.md says how to build it bound to loopback.
const actionloopAddr = "127.0.0.1:8080"

func startActionloop(b *testing.B, bin, interp, handlerDir string) *invokeTarget {
	if c, err := net.Dial("tcp", actionloopAddr); err == nil {
		c.Close()
		b.Fatalf("something already listens on %s, the actionloop proxy's fixed address", actionloopAddr)
	}
	dir := b.TempDir()
	cmd := exec.Command(bin)
	cmd.Dir = dir // it keeps the action under ./action
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	pid := startPeer(b, cmd)
	base := "http://" + actionloopAddr
	awaitHTTP(b, "the actionloop proxy", base+"/")
	initBody, _ := json.Marshal(map[string]any{"value": map[string]any{
		"code": fmt.Sprintf(actionloopLauncher, interp, handlerDir), "main": "main", "binary": false,
	}})
	resp, err := http.Post(base+"/init", "application/json", bytes.NewReader(initBody))
	if err != nil {
		b.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("actionloop /init: %d %s", resp.StatusCode, out)
	}
	return &invokeTarget{name: "actionloop", url: base + "/run", body: `{"value":` + benchInput + `}`,
		header: http.Header{"Content-Type": {"application/json"}}, root: pid, roleOf: peerRole}
}

func startRIE(b *testing.B, bin, interp, handlerDir string) *invokeTarget {
	dir := b.TempDir()
	boot := filepath.Join(dir, "bootstrap.py")
	if err := os.WriteFile(boot, fmt.Appendf(nil, rieBootstrap, handlerDir), 0o644); err != nil {
		b.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	cmd := exec.Command(bin,
		"--runtime-interface-emulator-address", addr,
		"--runtime-api-address", fmt.Sprintf("127.0.0.1:%d", freePort(b)),
		"--log-level", "error",
		interp, "-s", boot)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	pid := startPeer(b, cmd)
	base := "http://" + addr
	awaitHTTP(b, "the Lambda RIE", base+"/")
	return &invokeTarget{name: "rie", url: base + "/2015-03-31/functions/function/invocations", body: benchInput,
		header: http.Header{"Content-Type": {"application/json"}}, root: pid, roleOf: peerRole}
}
