package server_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/testbin"
)

// depsServer is a python Runtime Server with a requirements cache whose
// pip installs from a wheel directory holding tinydep 1.0 alone.
func depsServer(t testing.TB) (rs *runtimetest.Server, cache, links string) {
	t.Helper()
	cache, links = t.TempDir(), t.TempDir()
	if _, err := pydepstest.Wheel(links, "tinydep", "1.0", "VALUE = 'from tinydep'\n"); err != nil {
		t.Fatal(err)
	}
	rs = runtimetest.StartServer(t, runtimetest.Harness{Runtime: "python"}, func(c *server.Config) {
		c.PythonDeps, c.PipFindLinks = cache, links
		c.InitTimeout = 90 * time.Second // pip's start on a loaded machine
	})
	return rs, cache, links
}

const (
	depsHandler   = "import tinydep\n\ndef handle(event, context):\n    return tinydep.VALUE\n"
	noDepsHandler = "def handle(event, context):\n    return 'none'\n"
)

// registerWithRequirements registers handler.handle with requirements and
// returns its state and fatal_error.
func registerWithRequirements(t testing.TB, rs *runtimetest.Server, uid, requirements string) (*pb.FunctionRegistration, pb.FunctionRegistrationState, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files := map[string]string{"handler.py": depsHandler, "requirements.txt": requirements}
	if requirements == "" {
		files = map[string]string{"handler.py": noDepsHandler}
	} else if strings.HasPrefix(uid, "unused-") {
		files["handler.py"] = noDepsHandler // the requirements unused: their lookup alone
	}
	var env map[string]string
	if strings.HasPrefix(uid, "own-") {
		// A variable read at start, to no effect under -s: the worker
		// starts an interpreter of its own, as one with requirements does,
		// rather than taking the spare.
		env = map[string]string{"PYTHONNOUSERSITE": "1"}
	}
	dir := rs.Dir(t, runtimetest.Source{Files: files})
	resp, err := rs.Functions.RegisterFunction(ctx, &pb.RegisterFunctionRequest{RunUid: uid, RegistrationAttempt: 1, WorkingDir: dir,
		Handler: "handler.handle", IdleTimeoutSeconds: 300, RegistrationDigest: runtimetest.Digest(uid), Env: env})
	if err != nil {
		t.Fatal(err)
	}
	st, err := rs.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRegistration(), resp.GetState(), st.GetFatalError()
}

// A function whose source holds a requirements.txt imports what it lists;
// a second registration with the same requirements installs nothing (it
// succeeds with the wheel gone from the directory pip would install from).
func TestFunctionImportsItsRequirements(t *testing.T) {
	rs, _, links := depsServer(t)
	reg, state, fatal := registerWithRequirements(t, rs, "deps-1", "tinydep==1.0\n")
	if state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("state %v: %s", state, fatal)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := rs.Invoke(ctx, reg, "{}", 10_000)
	if err != nil || string(out.GetOutput()) != `"from tinydep"` {
		t.Fatalf("invoke: %v, %v; want \"from tinydep\"", out, err)
	}
	if err := os.RemoveAll(links); err != nil {
		t.Fatal(err)
	}
	if _, state, fatal := registerWithRequirements(t, rs, "deps-2", "tinydep==1.0\n"); state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("the same requirements again: state %v: %s; want READY without an install", state, fatal)
	}
}

// Concurrent first registrations with the same requirements all become
// READY from one complete install: one directory in the cache, nothing
// half-made left.
func TestConcurrentRegistrationsShareOneInstall(t *testing.T) {
	rs, cache, _ := depsServer(t)
	var wg sync.WaitGroup
	states := make([]pb.FunctionRegistrationState, 8)
	fatals := make([]string, 8)
	for i := range states {
		wg.Go(func() {
			_, states[i], fatals[i] = registerWithRequirements(t, rs, fmt.Sprintf("deps-c%d", i), "tinydep>=1.0\n")
		})
	}
	wg.Wait()
	for i, s := range states {
		if s != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			t.Fatalf("registration %d: %v: %s", i, s, fatals[i])
		}
	}
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) != 1 || strings.HasPrefix(dirs[0], ".") {
		t.Fatalf("the cache holds %v; want one install", dirs)
	}
}

// Requirements pip cannot install end the registration FAILED with pip's
// message in fatal_error.
func TestRequirementsThatCannotInstallFailTheRegistration(t *testing.T) {
	rs, _, _ := depsServer(t)
	_, state, fatal := registerWithRequirements(t, rs, "deps-bad", "nosuchdep==2.0\n")
	if state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED || !strings.Contains(fatal, "No matching distribution found for nosuchdep==2.0") {
		t.Fatalf("state %v, fatal_error %q; want FAILED with pip's message", state, fatal)
	}
}

// A python task imports its requirements too; one that cannot install
// fails, never having run.
func TestTaskImportsItsRequirements(t *testing.T) {
	rs, _, _ := depsServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, c := range []struct{ id, reqs, state, out string }{
		{"task-deps", "tinydep==1.0\n", "SUCCEEDED", "from tinydep"},
		{"task-deps-bad", "nosuchdep==2.0\n", "FAILED", "No matching distribution found for nosuchdep==2.0"},
	} {
		dir := rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.py": "import tinydep\nprint(tinydep.VALUE)\n", "requirements.txt": c.reqs}})
		if _, err := rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: c.id, WorkingDir: dir, Entrypoint: "task.py", TimeoutSeconds: 120}); err != nil {
			t.Fatal(err)
		}
		st, err := rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: c.id})
		for err == nil && st.GetState() <= pb.ExecutionState_EXECUTION_STATE_RUNNING {
			st, err = rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: c.id})
		}
		if err != nil {
			t.Fatal(err)
		}
		got := st.GetStdout() + st.GetErrorMessage()
		if strings.TrimPrefix(st.GetState().String(), "EXECUTION_STATE_") != c.state || !strings.Contains(got, c.out) {
			t.Fatalf("%s: %v; want %s with %q", c.id, st, c.state, c.out)
		}
	}
}

// BenchmarkRegisterPythonRequirements: a python registration whose
// requirements.txt (tinydep, from a wheel directory) is installed already
// (its handler imports tinydep; and one whose handler does not, the cache's
// part alone), beside one without requirements, interleaved, p50 of each
// and the differences; and, once before them, the first registration's, which
// installs (its extra time over the p50 without requirements).
//
// Both take the server's spare worker (the requirements directory is put
// on its sys.path at the handover), and each is timed with the spare idle
// on its pipe (awaited, untimed: the spare is made again 100 ms after a
// handover, and a registration that comes sooner waits for it). The extras
// are also given over a registration without requirements that starts its
// own interpreter (own: what a registration whose requirements the spare
// refuses pays). An untimed registration after none shares the CPUs with
// the next spare's start.
func BenchmarkRegisterPythonRequirements(b *testing.B) {
	rs, _, _ := depsServer(b)
	ready := func(uid, reqs string) time.Duration {
		t0 := time.Now()
		reg, state, fatal := registerWithRequirements(b, rs, uid, reqs)
		el := time.Since(t0)
		if state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			b.Fatalf("%s: %v: %s", uid, state, fatal)
		}
		// Untimed: 500 idle workers would crowd the machine.
		if _, err := rs.Functions.UnregisterFunction(context.Background(), &pb.UnregisterFunctionRequest{Registration: reg, CancelInFlight: true}); err != nil {
			b.Fatal(err)
		}
		return el
	}
	spare := func() {
		if _, err := testbin.AwaitPythonSpareIdle(os.Getpid(), time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	ready("warm-up", "") // the server's first registration, apart
	spare()
	first := ready("first", "tinydep==1.0\n")
	var none, own, installed, unused []time.Duration
	b.ResetTimer()
	for i := range b.N {
		spare()
		none = append(none, ready(fmt.Sprintf("none-%d", i), ""))
		// Not timed: it shares the CPUs with the next spare's start,
		// which follows a handover, so that the series below do not.
		ready(fmt.Sprintf("own-settle-%d", i), "")
		own = append(own, ready(fmt.Sprintf("own-%d", i), ""))
		spare()
		installed = append(installed, ready(fmt.Sprintf("installed-%d", i), "tinydep==1.0\n"))
		spare()
		unused = append(unused, ready(fmt.Sprintf("unused-%d", i), "tinydep==1.0\n"))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	n, o, w, u := p50(none), p50(own), p50(installed), p50(unused)
	b.ReportMetric(n, "none-p50-ms")
	b.ReportMetric(o, "own-p50-ms")
	b.ReportMetric(w, "installed-p50-ms")
	b.ReportMetric(w-n, "installed-extra-ms")
	b.ReportMetric(w-o, "installed-extra-own-ms")
	b.ReportMetric(u-n, "installed-unimported-extra-ms")
	b.ReportMetric(u-o, "installed-unimported-extra-own-ms")
	b.ReportMetric(float64(first.Microseconds())/1000-n, "first-install-extra-ms")
}
