package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/pool"
)

// `stoke up` serves Go's profiles on its debug socket and gives each pod
// one of its own, each in a directory of mode 0700 owned by this user;
// `stoke debug sockets` lists them and `stoke debug pprof` copies a
// profile from stoke up and from the pod of a function, named as `stoke
// get runs -o wide` shows it or by the function's Run; a Run that ended
// is on no pod, which it says. The sockets go with their processes.
func TestUpServesProfiles(t *testing.T) {
	dir := t.TempDir()
	u := startUp(t, dir)
	w := u.watchRuns(t)
	u.createRun(t, newRun("pyfn", v1alpha1.RunSpec{Runtime: "python",
		Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "m.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "m.py", Text: "def handle(event):\n    return event\n"}}}))
	u.createRun(t, newRun("done", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}))
	runs := w.until(t, 60*time.Second, "pyfn Ready and done ended", func(runs map[string]*v1alpha1.Run) bool {
		r, d := runs["pyfn"], runs["done"]
		return r != nil && (r.Status.Phase == v1alpha1.PhaseReady || r.Status.Phase.Terminal()) && d != nil && d.Status.Phase.Terminal()
	})
	fn := runs["pyfn"]
	if fn.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("pyfn is %s (%s: %s), want Ready", fn.Status.Phase, fn.Status.Reason, fn.Status.Message)
	}
	pod := fn.Status.AssignedPod
	upSock := datadir.DebugSocket(dir)
	podSock := filepath.Join(dir, "pods", pod, pool.DebugSocketName)
	for _, sock := range []string{upSock, podSock} {
		fi, err := os.Stat(filepath.Dir(sock))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Getuid() {
			t.Errorf("%s is in a directory of mode %v owned by uid %d, want 0700 owned by %d", sock, fi.Mode().Perm(), st.Uid, os.Getuid())
		}
	}

	// A Run's name is asked of the API server that --data-dir records,
	// with its token: nothing else to pass.
	run := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(stokeBin, args...)
		cmd.Env = append(os.Environ(), "STOKE_SERVER=", "STOKE_TOKEN=")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	stoke := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := run(args...)
		if err != nil {
			t.Fatalf("stoke %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		return stdout
	}
	list := stoke("debug", "sockets", "--data-dir", dir)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^PROCESS +STATE +SOCKET$`),
		regexp.MustCompile(`(?m)^up +live +` + regexp.QuoteMeta(upSock) + `$`),
		regexp.MustCompile(`(?m)^` + pod + ` +live +` + regexp.QuoteMeta(podSock) + `$`),
	} {
		if !want.MatchString(list) {
			t.Errorf("stoke debug sockets does not match %s:\n%s", want, list)
		}
	}
	if _, stderr, err := run("debug", "pprof", "--data-dir", dir, "--process", "done", "heap"); err == nil || !strings.Contains(stderr, "run default/done (uid "+string(runs["done"].UID)+") is "+string(runs["done"].Status.Phase)+" and on no pod") {
		t.Errorf("pprof of an ended Run: %v: %s", err, stderr)
	}

	for _, tg := range []struct {
		name  string
		flags []string
		frame string // a function only this process runs
	}{
		{"stoke up", nil, "stoke.dev/stoke/internal/up.Run+"},
		{"the pod", []string{"--process", pod}, "stoke.dev/stoke/internal/runtime/server.Run+"},
		{"the Run's pod", []string{"--process", "pyfn"}, "stoke.dev/stoke/internal/runtime/server.Run+"},
	} {
		base := append([]string{"debug", "pprof", "--data-dir", dir}, tg.flags...)
		if g := stoke(append(base, "--debug", "1", "goroutine")...); !strings.Contains(g, tg.frame) {
			t.Errorf("%s's goroutines do not show %s:\n%s", tg.name, tg.frame, g)
		}
		out := filepath.Join(t.TempDir(), "cpu.pprof")
		stoke(append(base, "--seconds", "1", "--output", out)...)
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s's CPU profile is not gzipped protobuf (%d bytes)", tg.name, len(b))
		}
	}

	w.stop()
	u.stop(t)
	if _, err := os.Lstat(upSock); err == nil || !os.IsNotExist(err) {
		t.Errorf("stoke up's debug socket is still there after it stopped: %v", err)
	}
	if _, err := os.Lstat(podSock); err == nil || !os.IsNotExist(err) {
		t.Errorf("the pod's debug socket is still there after stoke up stopped: %v", err)
	}
}
