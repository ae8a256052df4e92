package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// A Ready Python function whose pod's Runtime Server is killed with
// SIGKILL: while the Run is between pods every invocation answers 503 at
// once (never hangs, never another status), the Run comes back through
// the retry engine as attempt 2 on another pod under the same UID and
// endpoint, and nothing of the killed pod keeps running.
func TestUpFunctionAfterRuntimeServerKill(t *testing.T) {
	dir := t.TempDir()
	u := startUp(t, dir)
	w := u.watchRuns(t)

	// A call with {"slow": true} tells the test through a FIFO that it is
	// in flight, then outlasts the test.
	fifo := runsCanOpenFIFO(t, "in-flight")
	created := u.createRun(t, newRun("fn", v1alpha1.RunSpec{
		Runtime: "python",
		Mode:    v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "m.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "m.py", Text: `import os, time

def handle(event):
    if event.get("slow"):
        with open(os.environ["FIFO"], "w") as f:
            f.write("in flight\n")
        time.sleep(300)
    return {"echo": event}
`}},
		Env: []v1alpha1.EnvVar{{Name: "FIFO", Value: fifo}},
		// Losing its pod costs the Run an attempt (docs/runs.md: pod loss goes
		// through the retry engine); with the default of one attempt it
		// would end Failed/PodGone instead of coming back. The default
		// backoff (1 s) stays: it makes the gap between the pods last at
		// least that long.
		RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 3},
	}))
	runs := w.until(t, 60*time.Second, "fn to be Ready", func(runs map[string]*v1alpha1.Run) bool {
		r := runs["fn"]
		return r != nil && (r.Status.Phase == v1alpha1.PhaseReady || r.Status.Phase.Terminal())
	})
	ready := runs["fn"]
	if ready.Status.Phase != v1alpha1.PhaseReady || ready.Status.Attempt != 1 {
		t.Fatalf("fn: phase %s attempt %d (%s: %s), want Ready attempt 1", ready.Status.Phase, ready.Status.Attempt, ready.Status.Reason, ready.Status.Message)
	}
	endpoint := ready.Status.Endpoint
	if want := u.URL + "/v1/namespaces/default/runs/fn/" + string(created.UID) + "/invoke"; endpoint != want {
		t.Fatalf("endpoint %q, want %q", endpoint, want)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	checkEcho := func(i int, r invokeResult) {
		t.Helper()
		var out struct {
			Echo struct{ I int } `json:"echo"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || out.Echo.I != i {
			t.Fatalf("invocation %d answered %s (%v)", i, r.body, err)
		}
	}
	if r := invokeEndpoint(client, u.Token, endpoint, `{"i":0}`); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("invoke before the kill: %d %s %v", r.status, r.body, r.err)
	} else {
		checkEcho(0, r)
	}

	// The pod's Runtime Server: the one runtime-server process whose
	// command line names the pod's directory (its socket is there).
	oldPod, oldPodUID := ready.Status.AssignedPod, ready.Status.AssignedPodUID
	podDir := filepath.Join(dir, "pods", oldPod)
	var servers []process
	for _, p := range processesUnder(podDir) {
		if slices.Contains(p.cmdline, "runtime-server") {
			servers = append(servers, p)
		}
	}
	if len(servers) != 1 {
		t.Fatalf("want one runtime-server of pod %s, found:\n%s", oldPod, describeProcesses(servers))
	}
	server := servers[0]
	// What it started (the Python worker holding the registration) must
	// go with it.
	children := descendants(server.pid)
	if len(children) == 0 {
		t.Fatalf("runtime-server %d of pod %s has no child process: where is the Python worker?", server.pid, oldPod)
	}
	// One invocation is in flight when the server dies.
	slow := make(chan invokeResult, 1)
	go func() { slow <- invokeEndpoint(client, u.Token, endpoint, `{"slow":true}`) }()
	awaitFIFO(t, fifo, 30*time.Second)

	if err := syscall.Kill(server.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The call in flight ends at once: its owner is gone (503), and the
	// gateway does not retry it. It never hangs until the client's timeout.
	if r := <-slow; r.err != nil || r.status != http.StatusServiceUnavailable {
		t.Errorf("the invocation in flight at the kill: %d %s %v (client timeout: %v), want 503", r.status, r.body, r.err, isTimeout(r.err))
	} else if r.header.Get("Retry-After") == "" {
		// The function comes back (it has attempts left): every 503 says
		// when to try again (docs/http-api.md).
		t.Errorf("the invocation in flight at the kill: 503 without Retry-After: %s", bytes.TrimSpace(r.body))
	} else {
		t.Logf("the invocation in flight answered %d %s %v after the kill", r.status, bytes.TrimSpace(r.body), time.Since(killed).Round(time.Millisecond))
	}
	if left := awaitGone(5*time.Second, func() []process { return stillAlive([]process{server}) }); len(left) > 0 {
		t.Fatalf("runtime-server %d still runs 5s after SIGKILL", server.pid)
	}

	// From here no answer can come from the old registration. Invoke
	// until the function answers again: every answer before that is a
	// 503, none takes the client timeout.
	var n503 int
	errorTypes := map[string]int{}
	noRetryAfter := map[string]int{} // error message → count
	deadline := time.Now().Add(60 * time.Second)
	for i := 1; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("fn did not answer 200 within 60s of the kill (%d answers 503: %v)", n503, errorTypes)
		}
		r := invokeEndpoint(client, u.Token, endpoint, fmt.Sprintf(`{"i":%d}`, i))
		if r.err != nil {
			t.Fatalf("invocation %d after the kill: %v (client timeout: %v)", i, r.err, isTimeout(r.err))
		}
		if r.status == http.StatusOK {
			checkEcho(i, r)
			break
		}
		if r.status != http.StatusServiceUnavailable {
			t.Fatalf("invocation %d after the kill: %d %s, want 200 or 503", i, r.status, r.body)
		}
		n503++
		var body struct{ ErrorType, ErrorMessage string }
		_ = json.Unmarshal(r.body, &body)
		errorTypes[body.ErrorType]++
		if r.header.Get("Retry-After") == "" {
			noRetryAfter[body.ErrorMessage]++
		}
		time.Sleep(20 * time.Millisecond) // pacing the calls, not waiting for an event
	}
	t.Logf("fn answered again %v after the kill; %d answers 503 in between, by errorType: %v",
		time.Since(killed).Round(time.Millisecond), n503, errorTypes)
	// The retry's backoff (1 s by default) alone keeps the Run from being
	// Ready for that long, so calls paced at 20 ms must have seen the gap.
	if n503 == 0 {
		t.Error("no 503 between the kill and the next 200: the gap was not seen")
	}
	if len(noRetryAfter) > 0 {
		t.Errorf("503s without Retry-After for a function that came back, by message: %v", noRetryAfter)
	}

	after := u.getRun(t, "fn")
	if after.UID != created.UID || after.Status.Phase != v1alpha1.PhaseReady || after.Status.Attempt != 2 ||
		after.Status.Endpoint != endpoint || after.Status.AssignedPodUID == oldPodUID || after.Status.AssignedPod == "" {
		t.Errorf("after the kill: uid %s phase %s attempt %d pod %s (%s) endpoint %s; want uid %s, Ready, attempt 2, another pod than %s (%s), endpoint %s",
			after.UID, after.Status.Phase, after.Status.Attempt, after.Status.AssignedPod, after.Status.AssignedPodUID, after.Status.Endpoint,
			created.UID, oldPod, oldPodUID, endpoint)
	}
	// The retry went through Pending as attempt 2 (docs/runs.md).
	var path []string
	sawRetry := false
	for _, ev := range w.events("fn") {
		s := ev.run.Status
		path = append(path, fmt.Sprintf("%s/%d/%s", s.Phase, s.Attempt, s.Reason))
		if s.Phase == v1alpha1.PhasePending && s.Attempt == 2 {
			sawRetry = true
		}
	}
	t.Logf("fn's phase/attempt/reason as watched: %s", strings.Join(path, " → "))
	if !sawRetry {
		t.Error("the watch never showed fn Pending as attempt 2")
	}

	// Nothing of the killed pod runs any more.
	if left := awaitGone(5*time.Second, func() []process {
		return append(stillAlive(children), processesUnder(podDir)...)
	}); len(left) > 0 {
		t.Errorf("processes of the killed pod %s still run:\n%s", oldPod, describeProcesses(left))
	}

	u.stop(t)
}

// SIGKILL to `stoke up` itself while 60 tasks are in flight: nothing it
// started survives it, and after a restart on the same data directory
// every Run is still there and ends, each Succeeded one with the marker
// its task writes as its last act.
func TestUpKillAndRestartMidLoad(t *testing.T) {
	const (
		nRuns = 60
		// The first nLong Runs sleep far longer than the test: they are
		// surely running at the kill, and if any of their processes
		// outlived stoke up it would still be there to be found.
		nLong = 4
		// Succeeded Runs to wait for before the kill.
		nDoneBeforeKill = 10
	)
	dir, markers := t.TempDir(), runsCanWrite(t)
	u := startUp(t, dir)
	w := u.watchRuns(t)

	// Half the short tasks may be retried: losing their pod (here, all of
	// stoke up) costs an attempt, which they can afford, so they must all
	// end Succeeded. The others and the long ones have one attempt.
	type made struct {
		name    string
		uid     types.UID
		long    bool
		retried bool
	}
	runs := make([]made, nRuns)
	create := func(m *made) error {
		spec := v1alpha1.RunSpec{
			Runtime: "bash",
			Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"bash", "-c",
				`sleep "${SLEEP:-0.$RANDOM}" && echo done > "$MARKER_DIR/$NAME"`}}},
			Env: []v1alpha1.EnvVar{{Name: "MARKER_DIR", Value: markers}, {Name: "NAME", Value: m.name}},
		}
		if m.long {
			spec.Env = append(spec.Env, v1alpha1.EnvVar{Name: "SLEEP", Value: "300"})
		}
		if m.retried {
			spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 3, Backoff: &metav1.Duration{Duration: 100 * time.Millisecond}}
		}
		status, body, err := u.request(http.MethodPost, "/v1/namespaces/default/runs", newRun(m.name, spec))
		if err != nil {
			return err
		}
		if status != http.StatusCreated {
			return fmt.Errorf("create %s: %d %s", m.name, status, body)
		}
		var run v1alpha1.Run
		if err := json.Unmarshal(body, &run); err != nil {
			return fmt.Errorf("create %s: %w in %s", m.name, err, body)
		}
		if run.Name != m.name || run.UID == "" {
			return fmt.Errorf("create %s: created %q with uid %q", m.name, run.Name, run.UID)
		}
		m.uid = run.UID
		return nil
	}
	for i := range runs {
		m := &runs[i]
		m.name = fmt.Sprintf("load-%02d", i)
		m.long = i < nLong
		m.retried = !m.long && i%2 == 0
	}
	// The long ones first, so that they are scheduled first; then the rest
	// all at once.
	createStart := time.Now()
	for i := range runs[:nLong] {
		if err := create(&runs[i]); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, nRuns)
	var wg sync.WaitGroup
	for i := nLong; i < nRuns; i++ {
		wg.Go(func() { errs[i] = create(&runs[i]) })
	}
	wg.Wait()
	t.Logf("created %d Runs in %v", nRuns, time.Since(createStart).Round(time.Millisecond))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// Kill mid-load: the long tasks running, some short ones done, some
	// not.
	atKill := w.until(t, 60*time.Second, fmt.Sprintf("the long tasks running and %d tasks done", nDoneBeforeKill), func(seen map[string]*v1alpha1.Run) bool {
		done, pending := 0, 0
		for _, m := range runs {
			r := seen[m.name]
			switch {
			case r == nil:
				return false
			case m.long && r.Status.Phase != v1alpha1.PhaseRunning:
				return false
			case r.Status.Phase == v1alpha1.PhaseSucceeded:
				done++
			case !r.Status.Phase.Terminal():
				pending++
			}
		}
		return done >= nDoneBeforeKill && pending > nLong
	})
	// The check below can see what it looks for: each long task's
	// processes work in its Run's directory under the data directory.
	// (Running is written as the task is handed to its Runtime Server,
	// so its process may start a moment later; there is no event for that.)
	for _, m := range runs[:nLong] {
		runDir := filepath.Join(dir, "runs", string(m.uid))
		if !awaitProcess(10*time.Second, func() bool { return len(processesUnder(runDir)) > 0 }) {
			t.Fatalf("%s is Running but no process works in its directory", m.name)
		}
	}
	before := processesUnder(dir)
	killed := time.Now()
	u.kill9(t)
	t.Logf("killed stoke up with %s; %d processes referred to the data directory", phaseCounts(atKill), len(before))

	// Its pods have a parent-death signal; what they started must go with
	// them. There is no event for another process's death: poll.
	left := awaitNoProcessesUnder(dir, 3*time.Second)
	t.Logf("%v after the kill, %d processes refer to the data directory", time.Since(killed).Round(time.Millisecond), len(left))
	if len(left) > 0 {
		t.Errorf("3s after stoke up was killed, %d of the %d processes that referred to its data directory still run:\n%s",
			len(left), len(before), describeProcesses(left))
		// The test started them; the restart below must not meet them.
		for _, p := range left {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		if left := awaitNoProcessesUnder(dir, 5*time.Second); len(left) > 0 {
			t.Fatalf("still there after SIGKILL:\n%s", describeProcesses(left))
		}
	}
	// A task that wrote its marker well after the kill outlived stoke up
	// (a short one may be at its last act when the kill lands).
	ents, err := os.ReadDir(markers)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if late := fi.ModTime().Sub(killed); late > 500*time.Millisecond {
			t.Errorf("%s wrote its marker %v after stoke up was killed: its task outlived it", e.Name(), late.Round(time.Millisecond))
		}
	}

	// Restart on the same data directory.
	u2 := startUp(t, dir)
	if u2.Token != u.Token {
		t.Errorf("the token changed across the restart")
	}
	status, body := u2.do(t, http.MethodGet, "/v1/namespaces/default/runs", nil)
	if status != http.StatusOK {
		t.Fatalf("list after restart: %d %s", status, body)
	}
	var list v1alpha1.RunList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	listed := map[string]types.UID{}
	for _, r := range list.Items {
		listed[r.Name] = r.UID
	}
	for _, m := range runs {
		if uid, ok := listed[m.name]; !ok || uid != m.uid {
			t.Errorf("after restart %s is listed with uid %q (present: %v), want %s", m.name, uid, ok, m.uid)
		}
	}

	w2 := u2.watchRuns(t)
	final := w2.until(t, 60*time.Second, "every Run to be terminal", func(seen map[string]*v1alpha1.Run) bool {
		for _, m := range runs {
			if r := seen[m.name]; r == nil || !r.Status.Phase.Terminal() {
				return false
			}
		}
		return true
	})
	ends := map[string]int{}
	for _, m := range runs {
		r := final[m.name]
		s := r.Status
		ends[fmt.Sprintf("%s/%s", s.Phase, s.Reason)]++
		_, err := os.Stat(filepath.Join(markers, m.name))
		hasMarker := err == nil
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		switch {
		case s.Phase == v1alpha1.PhaseSucceeded && !hasMarker:
			t.Errorf("%s is Succeeded (attempt %d) but its task never wrote its marker", m.name, s.Attempt)
		case m.long && (s.Phase != v1alpha1.PhaseFailed || s.Reason != "PodGone"):
			// Its one attempt was lost with its pod (docs/runs.md: a Run
			// assigned to a pod nobody knows after a restart).
			t.Errorf("%s (running at the kill, one attempt): %s/%s %q, want Failed/PodGone", m.name, s.Phase, s.Reason, s.Message)
		case m.retried && s.Phase != v1alpha1.PhaseSucceeded:
			t.Errorf("%s (three attempts): %s/%s %q attempt %d, want Succeeded", m.name, s.Phase, s.Reason, s.Message, s.Attempt)
		case !m.long && s.Phase != v1alpha1.PhaseSucceeded && (s.Phase != v1alpha1.PhaseFailed || s.Reason != "PodGone"):
			t.Errorf("%s (one attempt): %s/%s %q, want Succeeded, or Failed/PodGone if it was in flight at the kill", m.name, s.Phase, s.Reason, s.Message)
		}
	}
	t.Logf("end states after the restart: %v", ends)

	u2.stop(t)
}
