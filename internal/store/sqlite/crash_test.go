package sqlite_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

// The crash test re-executes this test binary as a writer: with these
// variables set, TestCrashWriterHelper writes forever and prints one line
// per acknowledged write.
const (
	crashDirEnv   = "STOKE_STORE_CRASH_DIR"
	crashRoundEnv = "STOKE_STORE_CRASH_ROUND"
)

// crashWriters is how many goroutines write concurrently in the helper.
const crashWriters = 2

// TestCrashWriterHelper is not a test: it is the writer process of
// TestCrashRecovery. Each goroutine repeats: create a Run (ack), set its
// status (ack), delete every third Run (ack), and set the status of its own
// Runtime (ack). An ack is printed only after the call returned, that is
// after the commit.
func TestCrashWriterHelper(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("the writer process of TestCrashRecovery")
	}
	round := os.Getenv(crashRoundEnv)
	ctx := context.Background()
	s, err := sqlite.Open(ctx, dir)
	if err != nil {
		fmt.Fprintf(os.Stdout, "error open: %v\n", err)
		os.Exit(2)
	}
	fail := func(err error) {
		fmt.Fprintf(os.Stdout, "error %v\n", err)
		os.Exit(2)
	}
	var wg sync.WaitGroup
	for g := range crashWriters {
		wg.Go(func() {
			pool := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 4}}
			pool.Name = fmt.Sprintf("r%s-pool-%d", round, g)
			pool, err := s.Runtimes().Create(ctx, pool)
			if err != nil {
				fail(err)
			}
			fmt.Fprintf(os.Stdout, "ack runtime create %s %s\n", pool.Name, pool.ResourceVersion)
			for i := 0; ; i++ {
				name := fmt.Sprintf("r%s-g%d-%d", round, g, i)
				run, err := s.Runs().Create(ctx, newRun("default", name))
				if err != nil {
					fail(err)
				}
				fmt.Fprintf(os.Stdout, "ack run create %s %s\n", name, run.ResourceVersion)
				run.Status.Phase = v1alpha1.PhaseRunning
				run.Status.Attempt = 1
				run.Status.Message = strings.Repeat("m", 200)
				if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
					fail(err)
				}
				fmt.Fprintf(os.Stdout, "ack run status %s %s\n", name, run.ResourceVersion)
				if i%3 == 0 {
					if err := s.Runs().Delete(ctx, "default", name, store.DeleteOptions{}); err != nil {
						fail(err)
					}
					fmt.Fprintf(os.Stdout, "ack run delete %s -\n", name)
				}
				pool.Status.ReadyPods = int32(i + 1)
				if pool, err = s.Runtimes().UpdateStatus(ctx, pool); err != nil {
					fail(err)
				}
				fmt.Fprintf(os.Stdout, "ack runtime status %s %s\n", pool.Name, pool.ResourceVersion)
			}
		})
	}
	wg.Wait() // never returns: the parent kills this process
}

// crashAck is the last acknowledged write of one object.
type crashAck struct {
	kind, op string
	rv       uint64 // 0 for a delete
	// mayBeDeleted: the next write of this object, possibly committed but
	// not acknowledged, is a delete.
	mayBeDeleted bool
	readyPods    int32
}

// TestCrashRecovery kills a writer process with SIGKILL in the middle of a
// stream of writes, several times on one data directory, and checks after
// each kill that every acknowledged write survived, the database is intact
// and consistent, and the store takes new writes.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns writer processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	acked := map[string]*crashAck{} // "kind/name" → last acknowledged write
	for round := range 4 {
		killAfter := 150 + round*450 // acknowledgements before the kill
		firstRV, lines := runAndKill(t, exe, dir, round, killAfter, acked)
		t.Logf("round %d: killed after %d acknowledgements (%d read in all)", round, killAfter, lines)
		checkAfterCrash(t, dir, round, firstRV, acked)
	}
}

// runAndKill starts the writer, kills it after killAfter acknowledgements,
// reads every line it printed before dying and records the acks. It returns
// the smallest resourceVersion acknowledged in this round.
func runAndKill(t *testing.T, exe, dir string, round, killAfter int, acked map[string]*crashAck) (firstRV uint64, lines int) {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^TestCrashWriterHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "error" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("writer failed: %s\n%s", sc.Text(), stderr.String())
		}
		if len(f) != 5 || f[0] != "ack" {
			continue
		}
		lines++
		kind, op, name := f[1], f[2], f[3]
		a := &crashAck{kind: kind, op: op}
		if op != "delete" {
			if a.rv, err = strconv.ParseUint(f[4], 10, 64); err != nil {
				t.Fatalf("ack line %q: %v", sc.Text(), err)
			}
			if firstRV == 0 || a.rv < firstRV {
				firstRV = a.rv
			}
		}
		if kind == "run" && op == "status" {
			i, _ := strconv.Atoi(name[strings.LastIndexByte(name, '-')+1:])
			a.mayBeDeleted = i%3 == 0
		}
		if kind == "runtime" && op == "status" {
			a.readyPods = int32(acked[kind+"/"+name].readyPods + 1)
		}
		acked[kind+"/"+name] = a
		if lines == killAfter && !killed {
			// SIGKILL: no deferred code, no Close, nothing flushed by the
			// process itself.
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("writer exited after %d acknowledgements before being killed: %v\n%s", lines, err, stderr.String())
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.Success() {
		t.Fatalf("writer was not killed: %v", err)
	}
	return firstRV, lines
}

func checkAfterCrash(t *testing.T, dir string, round int, firstRV uint64, acked map[string]*crashAck) {
	t.Helper()
	ctx := context.Background()

	// SQLite's own check, on a connection of its own, before the store
	// touches the file. Opening the file recovers the WAL.
	db, err := sql.Open("sqlite", filepath.Join(dir, sqlite.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var integrity string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&integrity); err != nil || integrity != "ok" {
		t.Fatalf("round %d: integrity_check = %q, %v", round, integrity, err)
	}
	db.Close()

	s, err := sqlite.Open(ctx, dir)
	if err != nil {
		t.Fatalf("round %d: reopen after the kill: %v", round, err)
	}
	defer s.Close()

	// Everything decodes (List decodes every row), versions are unique and
	// covered by the list's version.
	runs, listRV, err := s.Runs().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatalf("round %d: list runs: %v", round, err)
	}
	pools, _, err := s.Runtimes().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatalf("round %d: list runtimes: %v", round, err)
	}
	top := rvOf(t, listRV)
	seenRV := map[string]string{}
	seenUID := map[string]string{}
	check := func(kind string, m metav1.Object) {
		v := m.GetResourceVersion()
		if rvOf(t, v) > top {
			t.Fatalf("round %d: %s %s at %s is newer than the list's %s", round, kind, m.GetName(), v, listRV)
		}
		if other, ok := seenRV[v]; ok {
			t.Fatalf("round %d: %s %s and %s share resourceVersion %s", round, kind, m.GetName(), other, v)
		}
		seenRV[v] = m.GetName()
		if other, ok := seenUID[string(m.GetUID())]; ok {
			t.Fatalf("round %d: %s %s and %s share uid %s", round, kind, m.GetName(), other, m.GetUID())
		}
		seenUID[string(m.GetUID())] = m.GetName()
	}
	for _, r := range runs {
		check("run", r)
	}
	for _, p := range pools {
		check("runtime", p)
	}

	// Every acknowledged write is there.
	for key, a := range acked {
		name := key[strings.IndexByte(key, '/')+1:]
		var (
			obj interface{ GetResourceVersion() string }
			err error
		)
		if a.kind == "run" {
			var r *v1alpha1.Run
			r, err = s.Runs().Get(ctx, "default", name)
			if err == nil {
				obj = r
				if a.op == "status" && r.Status.Phase != v1alpha1.PhaseRunning {
					t.Fatalf("round %d: run %s lost its acknowledged status: phase %q", round, name, r.Status.Phase)
				}
			}
		} else {
			var p *v1alpha1.Runtime
			p, err = s.Runtimes().Get(ctx, "default", name)
			if err == nil {
				obj = p
				if p.Status.ReadyPods < a.readyPods {
					t.Fatalf("round %d: runtime %s has readyPods %d, acknowledged %d", round, name, p.Status.ReadyPods, a.readyPods)
				}
			}
		}
		switch {
		case a.op == "delete":
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("round %d: %s: acknowledged delete, but get = %v", round, key, err)
			}
		case errors.Is(err, errdefs.ErrNotFound) && a.mayBeDeleted:
			// The unacknowledged delete that followed committed.
		case err != nil:
			t.Fatalf("round %d: %s: acknowledged %s at %d is lost: %v", round, key, a.op, a.rv, err)
		case rvOf(t, obj.GetResourceVersion()) < a.rv:
			t.Fatalf("round %d: %s is at %s, older than the acknowledged %d", round, key, obj.GetResourceVersion(), a.rv)
		}
	}

	// The log agrees: a watch from just before this round's first
	// acknowledged write replays without a gap up to the list's version.
	rw, err := s.Runs().Watch(ctx, store.WatchOptions{ResourceVersion: strconv.FormatUint(firstRV-1, 10)})
	if err != nil {
		t.Fatalf("round %d: watch from %d: %v", round, firstRV-1, err)
	}
	defer rw.Stop()
	pw, err := s.Runtimes().Watch(ctx, store.WatchOptions{ResourceVersion: strconv.FormatUint(firstRV-1, 10)})
	if err != nil {
		t.Fatalf("round %d: watch from %d: %v", round, firstRV-1, err)
	}
	defer pw.Stop()
	got := map[uint64]bool{}
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for v := firstRV; v <= top; v++ {
		// The next version is from one of the two kinds.
		var (
			typ    store.EventType
			evRV   string
			evErr  error
			closed bool
		)
		select {
		case ev, ok := <-rw.Events():
			closed, typ, evErr = !ok, ev.Type, ev.Err
			if ok && ev.Object != nil {
				evRV = ev.Object.ResourceVersion
			}
		case ev, ok := <-pw.Events():
			closed, typ, evErr = !ok, ev.Type, ev.Err
			if ok && ev.Object != nil {
				evRV = ev.Object.ResourceVersion
			}
		case <-timeout.C:
			t.Fatalf("round %d: replay stalled after %d of %d events", round, len(got), top-firstRV+1)
		}
		if closed || typ == store.Error {
			t.Fatalf("round %d: replay ended after %d events: %v", round, len(got), evErr)
		}
		got[rvOf(t, evRV)] = true
	}
	for v := firstRV; v <= top; v++ {
		if !got[v] {
			t.Fatalf("round %d: the log has no event at %d (replayed %d..%d)", round, v, firstRV, top)
		}
	}

	// And the store takes new writes, after everything that survived.
	fresh, err := s.Runs().Create(ctx, newRun("default", fmt.Sprintf("after-crash-%d", round)))
	if err != nil {
		t.Fatalf("round %d: write after reopen: %v", round, err)
	}
	if rvOf(t, fresh.ResourceVersion) <= top {
		t.Fatalf("round %d: new write at %s, not after %d", round, fresh.ResourceVersion, top)
	}
	acked["run/"+fresh.Name] = &crashAck{kind: "run", op: "create", rv: rvOf(t, fresh.ResourceVersion)}
}
