package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/httpapi"
)

// Ready functions with the default retry policy (one attempt) survive a
// restart of `stoke up`, clean (SIGTERM) or not (SIGKILL): on the new
// process each is registered again on a new pod with its attempt
// unchanged, at the same endpoint, and answers there. No watcher ever sees
// it Ready on the old pod; while it is registered again (held here by a
// gate its Bash source waits on) it is shown Pending, Scheduled or
// Running, and invocations get 503 with Retry-After.
func TestUpFunctionsSurviveRestart(t *testing.T) {
	for _, kind := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(kind, func(t *testing.T) { testRestart(t, kind) })
	}
}

func testRestart(t *testing.T, kind string) {
	dir := t.TempDir()
	u := startUp(t, dir)
	w := u.watchRuns(t)

	// The Bash function's source reads one line from the gate at each
	// registration, so the test decides when a registration completes.
	gate := runsCanOpenFIFO(t, "gate")
	gated := u.createRun(t, newRun("gated", v1alpha1.RunSpec{
		Runtime: "bash",
		Mode:    v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "h.sh", Text: `read -r _ < "$GATE"
handle() { printf '{"echo":%s}' "$1"; }
`}},
		Env: []v1alpha1.EnvVar{{Name: "GATE", Value: gate}},
	}))
	hello := u.createRun(t, newRun("hello", v1alpha1.RunSpec{
		Runtime: "python",
		Mode:    v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "m.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "m.py", Text: `def handle(event):
    return {"hello": event}
`}},
	}))
	openGate(t, gate)
	before := w.until(t, 60*time.Second, "both functions Ready", func(runs map[string]*v1alpha1.Run) bool {
		return bothIn(runs, v1alpha1.PhaseReady)
	})
	client := &http.Client{Timeout: 10 * time.Second}
	for _, name := range []string{"gated", "hello"} {
		r := before[name]
		if r.Status.Attempt != 1 || r.Status.Endpoint == "" {
			t.Fatalf("%s: attempt %d endpoint %q", name, r.Status.Attempt, r.Status.Endpoint)
		}
		if res := invokeEndpoint(client, u.Token, r.Status.Endpoint, `{"i":1}`); res.err != nil || res.status != http.StatusOK {
			t.Fatalf("%s before the restart: %d %s %v", name, res.status, res.body, res.err)
		}
	}
	w.stop()

	switch kind {
	case "SIGTERM":
		u.stop(t)
	case "SIGKILL":
		u.kill9(t)
		if left := awaitNoProcessesUnder(dir, 10*time.Second); len(left) > 0 {
			t.Fatalf("after the kill:\n%s", describeProcesses(left))
		}
	}
	addr, err := url.Parse(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	u2 := startUp(t, dir, "--listen", addr.Host)
	if u2.URL != u.URL {
		t.Fatalf("restarted on %s, want %s", u2.URL, u.URL)
	}
	// The first events list what the store holds once the new process
	// serves: never Ready on a pod of the old process.
	w2 := u2.watchRuns(t)

	// The gated function cannot be Ready: its registration waits at the
	// gate. It keeps its attempt and endpoint, and says why it is not Ready.
	now := u2.getRun(t, "gated")
	s := now.Status
	if s.Phase == v1alpha1.PhaseReady || s.Phase.Terminal() {
		t.Fatalf("gated after the restart, its registration held: %s/%s %q, want Pending, Scheduled or Running", s.Phase, s.Reason, s.Message)
	}
	if s.Attempt != 1 || s.Endpoint != before["gated"].Status.Endpoint {
		t.Errorf("gated after the restart: attempt %d endpoint %q, want 1 and %q", s.Attempt, s.Endpoint, before["gated"].Status.Endpoint)
	}
	if c := meta.FindStatusCondition(s.Conditions, "Ready"); c == nil || c.Status != "False" || c.Reason != "Restarted" {
		t.Errorf("gated after the restart: Ready condition %+v, want False/Restarted", c)
	}
	res := invokeEndpoint(client, u2.Token, before["gated"].Status.Endpoint, `{"i":2}`)
	if res.err != nil || res.status != http.StatusServiceUnavailable {
		t.Fatalf("gated while registered again: %d %s %v, want 503", res.status, res.body, res.err)
	}
	if secs, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || secs < 1 {
		t.Errorf("gated while registered again: Retry-After %q, want a number of seconds", res.header.Get("Retry-After"))
	}
	var body httpapi.ErrorBody
	if err := json.Unmarshal(res.body, &body); err != nil || body.ErrorType == "" {
		t.Errorf("gated while registered again: body %s (%v), want the JSON error body", res.body, err)
	}

	openGate(t, gate)
	after := w2.until(t, 60*time.Second, "both functions Ready again", func(runs map[string]*v1alpha1.Run) bool {
		return bothIn(runs, v1alpha1.PhaseReady)
	})
	for name, uid := range map[string]string{"gated": string(gated.UID), "hello": string(hello.UID)} {
		r, b := after[name], before[name]
		if string(r.UID) != uid || r.Status.Attempt != 1 || r.Status.Endpoint != b.Status.Endpoint {
			t.Errorf("%s after the restart: uid %s attempt %d endpoint %q, want %s, 1, %q", name, r.UID, r.Status.Attempt, r.Status.Endpoint, uid, b.Status.Endpoint)
		}
		if r.Status.AssignedPodUID == b.Status.AssignedPodUID {
			t.Errorf("%s is Ready on the old pod %s", name, r.Status.AssignedPod)
		}
		if !r.Status.StartTime.Equal(b.Status.StartTime) {
			t.Errorf("%s: startTime %v, want the first one, %v", name, r.Status.StartTime, b.Status.StartTime)
		}
		res := invokeEndpoint(client, u2.Token, b.Status.Endpoint, `{"i":3}`)
		if res.err != nil || res.status != http.StatusOK {
			t.Errorf("%s after the restart: %d %s %v", name, res.status, res.body, res.err)
		}
	}
	for _, name := range []string{"gated", "hello"} {
		oldPod := before[name].Status.AssignedPodUID
		for _, ev := range w2.events(name) {
			st := ev.run.Status
			if st.Phase.Terminal() || (st.Phase == v1alpha1.PhaseReady && st.AssignedPodUID == oldPod) {
				t.Errorf("%s: the watch after the restart showed %s on pod %s (the old one: %v)", name, st.Phase, st.AssignedPod, st.AssignedPodUID == oldPod)
			}
		}
	}
	u2.stop(t)
}

// bothIn reports whether the Runs gated and hello are both in phase.
func bothIn(runs map[string]*v1alpha1.Run, phase v1alpha1.Phase) bool {
	for _, name := range []string{"gated", "hello"} {
		if r := runs[name]; r == nil || r.Status.Phase != phase {
			return false
		}
	}
	return true
}

// openGate lets one registration of the gated function through: it opens
// the FIFO for writing, which waits until the function's source opens it
// for reading, and writes the line that source reads.
func openGate(t *testing.T, path string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString("go\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("opening the gate: %v", err)
		}
	case <-time.After(60 * time.Second):
		// Release the writer: a reader completes its open.
		if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatalf("no registration read the gate %s within a minute", path)
	}
}
