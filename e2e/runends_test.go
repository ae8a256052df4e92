package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// How Runs end and go, as a user sees it: `stoke logs -f` ends with how
// the Run ended, `stoke run --rm` deletes it, and `stoke up
// --finished-run-ttl` deletes finished Runs that set no TTL of their own.
func TestRunEnds(t *testing.T) {
	u := startUp(t, t.TempDir(), "--finished-run-ttl", "2s")
	t.Cleanup(func() { u.stop(t) })
	s := &cliServer{Up: u.Up}
	w := u.watchRuns(t)

	t.Run("finished runs expire unless they keep their own TTL", func(t *testing.T) {
		s.ok(t, "run", "--runtime", "bash", "--name", "kept", "--ttl", "1h", "-q", "--", "true")
		s.ok(t, "run", "--runtime", "bash", "--name", "expires", "-q", "--", "true")
		done := s.getRun(t, "expires")
		gone := w.untilEvent(t, 60*time.Second, "expires to be deleted", func(typ string, run *v1alpha1.Run) bool {
			return typ == "DELETED" && run.Name == "expires"
		})
		if !done.Status.Phase.Terminal() || done.Status.CompletionTime == nil || gone.Sub(done.Status.CompletionTime.Time) < time.Second {
			t.Errorf("deleted at %v; the run %s finished at %v", gone, done.Status.Phase, done.Status.CompletionTime)
		}
		logFile := filepath.Join(s.DataDir, "logs", string(done.UID)+".log")
		if !awaitProcess(10*time.Second, func() bool { _, err := os.Stat(logFile); return errors.Is(err, fs.ErrNotExist) }) {
			t.Errorf("the log of the expired run is still there")
		}
		if run := s.getRun(t, "kept"); run.Status.Phase != v1alpha1.PhaseSucceeded {
			t.Errorf("kept: %s", run.Status.Phase)
		}
	})

	t.Run("run --rm deletes the task when it finished or was interrupted", func(t *testing.T) {
		s.ok(t, "run", "--runtime", "bash", "--name", "rm-ok", "--rm", "-q", "--", "true")
		s.fails(t, 1, "not found", "get", "run", "rm-ok")
		if r := stoke(t, s.env(), "", "run", "--runtime", "bash", "--name", "rm-fail", "--rm", "--", "bash", "-c", "exit 3"); r.code != 3 {
			t.Errorf("run --rm of a task exiting 3: %s", r)
		}
		s.fails(t, 1, "not found", "get", "run", "rm-fail")

		run, lines, stderr := startStoke(t, s.env(), "run", "--runtime", "bash", "--name", "rm-int", "--rm", "--", "bash", "-c", "echo started; sleep 60")
		awaitLine(t, lines, "the task to start", func(l string) bool { return l == "started" })
		if err := run.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, run); code != 130 || !strings.Contains(stderr.String(), "stoke: interrupted; cancelled and deleted run/rm-int") {
			t.Errorf("run --rm after SIGINT: exit %d, stderr %q", code, stderr)
		}
		s.fails(t, 1, "not found", "get", "run", "rm-int")
	})

	t.Run("logs -f ends with how the run ended", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			args   []string
			stdout string
			last   string
		}{
			{"exit3", []string{"--", "bash", "-c", "echo out; exit 3"}, "out\n", "stoke: run/exit3 Failed (NonZeroExit), exit code 3"},
			{"slow", []string{"--timeout", "1s", "--", "bash", "-c", "echo slow; sleep 60"}, "slow\n", "stoke: run/slow Timeout, exit code 143: exceeded its timeout of 1s"},
			{"ok", []string{"--", "echo", "fine"}, "fine\n", "stoke: run/ok Succeeded, exit code 0"},
		} {
			s.ok(t, append([]string{"run", "--runtime", "bash", "--name", tc.name, "--ttl", "1h", "-d"}, tc.args...)...)
			r := stoke(t, s.env(), "", "logs", "-f", tc.name)
			if r.code != 0 || r.stdout != tc.stdout || !strings.HasPrefix(lastLine(r.stderr), tc.last) {
				t.Errorf("logs -f %s: want %q last on stderr, got %s", tc.name, tc.last, r)
			}
		}
		s.ok(t, "run", "--runtime", "bash", "--name", "cancelled", "--ttl", "1h", "-d", "--", "sleep", "60")
		s.ok(t, "cancel", "cancelled")
		if r := stoke(t, s.env(), "", "logs", "-f", "cancelled"); r.code != 0 || !strings.HasPrefix(lastLine(r.stderr), "stoke: run/cancelled Cancelled") {
			t.Errorf("logs -f of a cancelled task: %s", r)
		}
	})

	t.Run("a truncated log still ends with the exit record", func(t *testing.T) {
		// 10 MB in lines of 10,000 bytes: past the 8 MiB a Run's log keeps.
		s.ok(t, "run", "--runtime", "bash", "--name", "big", "--ttl", "1h", "-d", "--",
			"bash", "-c", `head -c 10000000 /dev/zero | tr '\0' x | fold -w 10000; exit 4`)
		r := stoke(t, s.env(), "", "logs", "-f", "big")
		if r.code != 0 || !strings.Contains(r.stderr, "stoke: the log reached its size limit") ||
			!strings.HasPrefix(lastLine(r.stderr), "stoke: run/big Failed (NonZeroExit), exit code 4") {
			t.Errorf("logs -f big: exit %d, %d bytes of stdout, stderr %q", r.code, len(r.stdout), r.stderr)
		}
		recs := rawLog(t, s, "big")
		last := recs[len(recs)-1]
		if last.Stream != "exit" || last.ExitCode == nil || *last.ExitCode != 4 || last.Attempt != 1 {
			t.Errorf("last record %+v, want the exit record with code 4", last)
		}
	})
}

// logRecord is one record of GET …/logs.
type logRecord struct {
	Attempt      int32  `json:"attempt"`
	Stream       string `json:"stream"`
	Line         string `json:"line"`
	InvocationID string `json:"invocationId"`
	ExitCode     *int32 `json:"exitCode"`
}

// rawLog reads a Run's log from the HTTP API.
func rawLog(t *testing.T, s *cliServer, name string) []logRecord {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL+"/v1/namespaces/default/runs/"+name+"/logs", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("logs of %s: %s", name, resp.Status)
	}
	var recs []logRecord
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec logRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("logs of %s: %q: %v", name, sc.Bytes(), err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil || len(recs) == 0 {
		t.Fatalf("logs of %s: %d records, %v", name, len(recs), err)
	}
	return recs
}

// untilEvent waits, at most timeout, for an event of the watch that match
// accepts (it may have come already) and returns when it was seen.
func (w *runWatch) untilEvent(t *testing.T, timeout time.Duration, what string, match func(typ string, run *v1alpha1.Run) bool) time.Time {
	t.Helper()
	var at time.Time
	w.until(t, timeout, what, func(map[string]*v1alpha1.Run) bool {
		// until holds w.mu while it asks.
		for _, ev := range w.history {
			if match(ev.typ, ev.run) {
				at = ev.at
				return true
			}
		}
		return false
	})
	return at
}
