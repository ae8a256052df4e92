package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/testbin"
)

// probeScript is a task that records, as outputs, who it runs as and what
// each attempt to reach the server's files said (the error of cat or ls,
// empty when it succeeded), and whether it can write its own files.
const probeScript = `fails() { "$@" 2>&1 >/dev/null; }
{
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "groups=$(id -G)"
echo "token=$(fails cat "$D/token")"
echo "sqlite=$(fails cat "$D/db/stoke.db")"
echo "datadir=$(fails ls "$D")"
echo "runs=$(fails ls "$D/runs")"
echo "pods=$(fails ls "$D/pods")"
echo "logs=$(fails ls "$D/logs")"
echo "home=$(fails touch "$HOME/mine")"
echo "tmp=$(fails touch "$TMPDIR/mine")"
} >> "$STOKE_OUTPUTS"
`

// When stoke up is root, its Runs are not: a task, a Bash and a Python
// function and an exec session into each run as the unprivileged user
// (runuser.DefaultID, no supplementary groups), write their own working
// directory, TMPDIR and outputs, and reach none of the server's files —
// the token, the SQLite store, the logs, the pods (with their sockets) —
// nor list the data directory or the Runs' directories. Run by a stoke up
// that is not root, a task runs as stoke up's user and the data directory
// stays private, as before.
func TestRunsRunAsAnUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		// Only root can become another user; what is left to check is
		// that nothing changed.
		assertRunsAsStokeUp(t, startUp(t, t.TempDir()), os.Geteuid())
		return
	}
	dir := t.TempDir()
	u := startUp(t, dir)
	w := u.watchRuns(t)
	want := strconv.Itoa(runuser.DefaultID)

	fn := func(name, runtime, handler, path, text string) *v1alpha1.Run {
		return newRun(name, v1alpha1.RunSpec{Runtime: runtime,
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: handler}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: path, Text: text}}})
	}
	bashFn := u.createRun(t, fn("bash-fn", "bash", "h.handle", "h.sh",
		`handle() { echo "uid=$(id -u)" >> "$STOKE_OUTPUTS"; touch "$HOME/mine" "$TMPDIR/mine" && printf '{"uid":%s}' "$(id -u)"; }`+"\n"))
	pyFn := u.createRun(t, fn("python-fn", "python", "m.handle", "m.py", `import os

def handle(event, context):
    context.set_output("uid", str(os.getuid()))
    for d in (os.getcwd(), os.environ["TMPDIR"]):
        with open(os.path.join(d, "mine"), "w") as f:
            f.write("x")
    return {"uid": os.getuid(), "groups": os.getgroups()}
`))
	ready := w.until(t, 2*time.Minute, "both functions Ready", func(runs map[string]*v1alpha1.Run) bool {
		for _, n := range []string{"bash-fn", "python-fn"} {
			if r := runs[n]; r == nil || r.Status.Phase != v1alpha1.PhaseReady {
				return false
			}
		}
		return true
	})

	probe := taskRun("probe", probeScript)
	probe.Spec.Env = []v1alpha1.EnvVar{{Name: "D", Value: dir}}
	done := runToEnd(t, u, w, probe)
	if done.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("probe task: %s %s", done.Status.Phase, done.Status.Message)
	}
	out := done.Status.Outputs
	if out["uid"] != want || out["gid"] != want || out["groups"] != want {
		t.Errorf("the task runs as uid %q gid %q groups %q; want %s, %s and no other group", out["uid"], out["gid"], out["groups"], want, want)
	}
	// Runs share their user (docs/runtime-server.md): one that knows
	// another's UID can reach its directory, but none can list them.
	for _, k := range []string{"token", "sqlite", "datadir", "runs", "pods", "logs"} {
		if !strings.Contains(out[k], "Permission denied") {
			t.Errorf("the task reaching the data directory's %s: %q; want Permission denied", k, out[k])
		}
	}
	for _, k := range []string{"home", "tmp"} {
		if out[k] != "" {
			t.Errorf("the task writing its own %s: %q", k, out[k])
		}
	}

	for _, run := range []*v1alpha1.Run{bashFn, pyFn} {
		res := invokeEndpoint(http.DefaultClient, u.Token, ready[run.Name].Status.Endpoint, `{}`)
		if res.err != nil || res.status != 200 {
			t.Fatalf("%s: %d %v %s", run.Name, res.status, res.err, res.body)
		}
		var got struct {
			UID    int   `json:"uid"`
			Groups []int `json:"groups"`
		}
		if err := json.Unmarshal(res.body, &got); err != nil || got.UID != runuser.DefaultID || len(got.Groups) > 1 {
			t.Errorf("%s answered %s (%v); want uid %d and no supplementary group", run.Name, res.body, err, runuser.DefaultID)
		}
		if h := res.header.Get(httpapi.HeaderOutputs); !strings.Contains(h, `"uid":"`+want+`"`) {
			t.Errorf("%s's outputs: %q; want uid %s", run.Name, h, want)
		}
		// An exec session runs as the Runs do.
		r := stoke(t, []string{"STOKE_SERVER=" + u.URL, "STOKE_TOKEN=" + u.Token}, "", "exec", run.Name, "--", "sh", "-c", "id -u; id -G")
		if r.code != 0 || r.stdout != want+"\n"+want+"\n" {
			t.Errorf("stoke exec %s -- id: %s", run.Name, r)
		}
	}

	// None of the server's own directories was handed over.
	for _, p := range []string{"token", "db", "pods", "logs"} {
		if st := statOf(t, filepath.Join(dir, p)); st.Uid != 0 || st.Mode&0o077 != 0 {
			t.Errorf("%s: owner %d, mode %#o; want root's, private", p, st.Uid, st.Mode&0o7777)
		}
	}
	u.stop(t)

	// A stoke up that is not root: its Runs run as its user, and its data
	// directory stays private.
	const other = runuser.DefaultID - 1
	assertRunsAsStokeUp(t, startUpAs(t, other), other)
}

// startUpAs starts stoke up as uid (and gid) uid on a data directory of
// its own, from a copy of the stoke binary it can run.
func startUpAs(t *testing.T, uid int) *stokeUp {
	t.Helper()
	top := t.TempDir()
	bin, dataDir := filepath.Join(top, "stoke"), filepath.Join(top, "data")
	src, err := os.Open(stokeBin)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dataDir, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testbin.RunsCanPass(top); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dataDir}
	up, err := testbin.StartUpAs(&syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}, env, bin, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stoke up (uid %d) log:\n%s", uid, strings.Join(up.Log(), "\n"))
		}
		if err := up.Close(); err != nil {
			t.Error(err)
		}
		for _, p := range processesUnder(dataDir) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	})
	return &stokeUp{Up: up}
}

// assertRunsAsStokeUp asserts that a task of u runs as uid, stoke up's
// own, and that u's data directory stays private to it.
func assertRunsAsStokeUp(t *testing.T, u *stokeUp, uid int) {
	t.Helper()
	w := u.watchRuns(t)
	done := runToEnd(t, u, w, taskRun("whoami", `echo "uid=$(id -u)" >> "$STOKE_OUTPUTS"`))
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.Outputs["uid"] != strconv.Itoa(uid) {
		t.Errorf("a task of a stoke up running as uid %d: %s %q, uid %q", uid, done.Status.Phase, done.Status.Message, done.Status.Outputs["uid"])
	}
	for _, p := range []string{".", "runs"} {
		if st := statOf(t, filepath.Join(u.DataDir, p)); int(st.Uid) != uid || st.Mode&0o777 != 0o700 {
			t.Errorf("%s of the data directory of a stoke up running as uid %d: owner %d, mode %#o; want its own, 0700", p, uid, st.Uid, st.Mode&0o777)
		}
	}
	u.stop(t)
}

func statOf(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(fmt.Errorf("stat %s: %w", path, err))
	}
	return &st
}
