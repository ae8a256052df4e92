package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/internal/bounds"
)

// aliasRun is the adversarial probe's YAML Run (issue 17): one label value
// of 3.9 MB under an anchor, and aliases of it as further labels (the
// 19-label case) or annotations (the 99 case), within the 4 MiB body
// bound on the wire.
func aliasRun(name, under string, aliases int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata:\n  name: %s\n  labels:\n    a: &big \"%s\"\n", name, strings.Repeat("x", 3900<<10))
	if under == "annotations" {
		b.WriteString("  annotations:\n")
	}
	for i := range aliases {
		fmt.Fprintf(&b, "    k%d: *big\n", i)
	}
	b.WriteString("spec:\n  runtime: bash\n  mode:\n    task:\n      args: [\"true\"]\n")
	return b.Bytes()
}

// procStatusKiB reads a field (VmRSS, VmHWM) of /proc/PID/status.
func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// post sends a body with a Content-Type and returns the status and the
// body of the answer.
func (u *stokeUp) post(path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, u.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+u.Token)
	req.Header.Set("Content-Type", contentType)
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// logSettled returns how many bytes stoke up has written to its log once
// every line before now is read: it asks for a Run named after a fresh
// marker and waits for that 404's log line.
func (u *stokeUp) logSettled(t *testing.T) int64 {
	t.Helper()
	marker := fmt.Sprintf("settled-%d", time.Now().UnixNano())
	if status, _ := u.do(t, http.MethodGet, "/v1/namespaces/default/runs/"+marker, nil); status != http.StatusNotFound {
		t.Fatalf("get %s: %d", marker, status)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		for _, line := range u.Log() {
			if strings.Contains(line, marker) {
				return u.StderrBytes()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stoke up never logged the request for %s", marker)
		}
		time.Sleep(10 * time.Millisecond) // polling the log, an observable state
	}
}

// Hostile bodies cost stoke up memory and log in proportion to the body
// bound, not to what they expand to (issue 17, items 1 and 2): ten
// concurrent copies of the 99-alias YAML Run are each refused with 400 while
// stoke up's peak RSS grows by less than 100 MiB; the 19-label alias Run,
// and a JSON Run with one 3 MiB label value, get a 400 of a few KiB and a
// log line of a few KiB.
func TestUpBoundsHostileBodies(t *testing.T) {
	u := startUp(t, t.TempDir())
	const copies = 10
	amp := aliasRun("amp", "annotations", 99)
	if len(amp) > bounds.ObjectBody {
		t.Fatalf("the alias Run is %d bytes, over the body bound", len(amp))
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", u.Pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting stoke up's peak RSS: %v", err)
	}
	before := procStatusKiB(t, u.Pid, "VmRSS")
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, copies)
	for range copies {
		wg.Go(func() {
			status, body, err := u.post("/v1/namespaces/default/runs", "application/yaml", amp)
			switch {
			case err != nil:
				errs <- err
			case status != http.StatusBadRequest || len(body) > 2*bounds.Message:
				errs <- fmt.Errorf("status %d, %d bytes: %.300s, want a small 400", status, len(body), body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	growth := procStatusKiB(t, u.Pid, "VmHWM") - before
	t.Logf("%d concurrent %d-byte alias Runs refused in %v; stoke up's peak RSS grew by %d KiB (from %d KiB)", copies, len(amp), time.Since(start), growth, before)
	if growth >= 100<<10 {
		t.Errorf("stoke up's peak RSS grew by %d KiB, want under 100 MiB", growth)
	}

	label := fmt.Sprintf(`{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":"big-label","labels":{"a":%q}},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, strings.Repeat("x", 3<<20))
	for _, tt := range []struct {
		name, contentType string
		body              []byte
	}{
		{"19 aliased labels", "application/yaml", aliasRun("labels19", "labels", 19)},
		{"one 3 MiB label value", "application/json", []byte(label)},
	} {
		logBefore := u.logSettled(t)
		status, body, err := u.post("/v1/namespaces/default/runs", tt.contentType, tt.body)
		if err != nil {
			t.Fatal(err)
		}
		logged := u.logSettled(t) - logBefore
		t.Logf("%s: %d, %d bytes: %.200s; %d bytes of log", tt.name, status, len(body), body, logged)
		if status != http.StatusBadRequest || len(body) > 2*bounds.Message {
			t.Errorf("%s: status %d, %d bytes, want a 400 of at most %d bytes", tt.name, status, len(body), 2*bounds.Message)
		}
		// The request's line and the marker's, each with a few attributes
		// of at most bounds.Message bytes.
		if logged > 16*bounds.Message {
			t.Errorf("%s: %d bytes of log, want at most %d", tt.name, logged, 16*bounds.Message)
		}
	}
}
