package containerinit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/syncbuf"

	"stoke.dev/stoke/internal/kubetest/nodeagent/containerinit"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/testbin"
)

var initBinary string

func TestMain(m *testing.M) {
	path, cleanup, err := testbin.Build("stoke.dev/stoke/internal/kubetest/nodeagent/containerinit/cmd/stoke-container-init", "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	initBinary = path
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// start starts the init as the node agent does.
func start(t *testing.T, spec containerinit.Spec, out *syncbuf.Buffer) *proc.Process {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(initBinary)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{pr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS}
	p, err := proc.Start(cmd, proc.NewSession())
	pr.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(0) })
	if err := json.NewEncoder(pw).Encode(spec); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	return p
}

// waitFile polls for a file the container writes (outside state with no
// event to await), failing if the init exits first.
func waitFile(t *testing.T, p *proc.Process, path string, out *syncbuf.Buffer) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && bytes.HasSuffix(b, []byte("\n")) {
			return strings.TrimSpace(string(b))
		}
		select {
		case <-p.Done():
			t.Fatalf("init exited (%d) before %s appeared; output: %s", p.ExitCode(), path, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear; output: %s", path, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// withMarker returns the host pids of live processes whose environment
// holds marker.
func withMarker(marker string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil || bytes.Contains(st, []byte(") Z ")) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

func TestContainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the container init needs root (namespaces, mounts); tests run as root here and in CI")
	}
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	sec := filepath.Join(dir, "secret")
	for _, d := range []string{vol, sec, filepath.Join(dir, "root")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sec, "token"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Mount points that do not exist on the host: under a host directory
	// (/var/run → /run, through a symlink), and at the top level.
	top := fmt.Sprintf("/stoke-init-test-%d", os.Getpid())
	runDir := fmt.Sprintf("/var/run/stoke-init-test-%d", os.Getpid())
	marker := fmt.Sprintf("STOKE_INIT_TEST_MARKER=%d", time.Now().UnixNano())
	script := `
set -e
echo "$(hostname) $(tr '\0' ' ' < /proc/1/cmdline)" > ` + top + `/who.tmp && mv ` + top + `/who.tmp ` + top + `/who
cat /var/run/secrets/kubernetes.io/serviceaccount/token > ` + top + `/token
if touch /var/run/secrets/kubernetes.io/serviceaccount/x 2>/dev/null; then echo writable; else echo read-only; fi > ` + top + `/ro
ls ` + runDir + ` > /dev/null
setsid sleep 3600 &
echo started > ` + top + `/started
exec sleep 3600
`
	spec := containerinit.Spec{
		Hostname: "pod-a",
		Root:     filepath.Join(dir, "root"),
		Mounts: []containerinit.Mount{
			{Source: vol, Target: top},
			{Source: vol, Target: runDir},
			{Source: sec, Target: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
		},
		Argv:       []string{"sh", "-c", script},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", marker, "GREETING=hi"},
		ExecSocket: filepath.Join(dir, "exec.sock"),
	}
	var out syncbuf.Buffer
	p := start(t, spec, &out)
	waitFile(t, p, filepath.Join(vol, "started"), &out)

	if who := waitFile(t, p, filepath.Join(vol, "who"), &out); who != "pod-a "+initBinary {
		t.Errorf("hostname and PID 1 in the container = %q, want %q (its own UTS and PID namespaces, the init as PID 1)", who, "pod-a "+initBinary)
	}
	if tok := waitFile(t, p, filepath.Join(vol, "token"), &out); tok != "s3cret" {
		t.Errorf("token = %q", tok)
	}
	if ro := waitFile(t, p, filepath.Join(vol, "ro"), &out); ro != "read-only" {
		t.Errorf("the secret mount is %s", ro)
	}
	for _, host := range []string{top, runDir, "/var/run/secrets/kubernetes.io/serviceaccount/token"} {
		if _, err := os.Stat(host); err == nil {
			t.Errorf("%s exists on the host: mount points must be made on tmpfs in the container's namespace", host)
		}
	}

	// exec runs in the container's namespaces and environment.
	res, err := containerinit.Exec(context.Background(), spec.ExecSocket, containerinit.ExecRequest{
		Argv: []string{"sh", "-c", "echo $GREETING $(hostname); ls " + top + "; exit 3"}, Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || !strings.Contains(res.Output, "hi pod-a") || !strings.Contains(res.Output, "who") {
		t.Errorf("exec = %+v", res)
	}
	res, err = containerinit.Exec(context.Background(), spec.ExecSocket, containerinit.ExecRequest{
		Argv: []string{"sleep", "10"}, Timeout: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut {
		t.Errorf("exec past its timeout = %+v", res)
	}

	// The escapee left the session; the PID namespace still holds it.
	escapees := withMarker(marker)
	if len(escapees) < 2 {
		t.Fatalf("processes of the container on the host: %v, want the sleep and the setsid escapee", escapees)
	}
	p.Kill(0)
	if left := withMarker(marker); len(left) > 0 {
		t.Errorf("processes left after the init was killed: %v", left)
	}
}

func TestContainerExitStatus(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	p := start(t, containerinit.Spec{
		Root: filepath.Join(dir, "root"), Argv: []string{"sh", "-c", "echo bye; exit 7"},
		Env: []string{"PATH=/usr/bin:/bin"}, ExecSocket: filepath.Join(dir, "exec.sock"),
	}, &out)
	<-p.Done()
	if p.ExitCode() != 7 || strings.TrimSpace(out.String()) != "bye" {
		t.Errorf("exit %d, output %q; want 7, bye", p.ExitCode(), out.String())
	}
}

func TestContainerSIGTERMReachesTheCommand(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	p := start(t, containerinit.Spec{
		Root: filepath.Join(dir, "root"), Argv: []string{"sh", "-c", "trap 'echo term; exit 5' TERM; echo up; while :; do sleep 0.05; done"},
		Env: []string{"PATH=/usr/bin:/bin"}, ExecSocket: filepath.Join(dir, "exec.sock"),
	}, &out)
	// The socket exists once the init has set up; the command's "up" follows.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "up") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the container's output
	}
	if err := syscall.Kill(p.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if p.ExitCode() != 5 || !strings.Contains(out.String(), "term") {
		t.Errorf("exit %d, output %q; want 5 and term", p.ExitCode(), out.String())
	}
}
