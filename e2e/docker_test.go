package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// dockerCLIs are the Docker CLIs the tests drive: Debian's docker.io
// (/usr/bin/docker, API 1.41; .ci/run installs it), the one on PATH, if
// it is another, and $STOKE_TEST_DOCKER_CLI (a CLI unpacked elsewhere).
func dockerCLIs(t *testing.T) []string {
	t.Helper()
	var clis []string
	if p := os.Getenv("STOKE_TEST_DOCKER_CLI"); p != "" {
		clis = append(clis, p)
	}
	for _, p := range []string{"/usr/bin/docker", "/usr/local/bin/docker"} {
		if _, err := os.Stat(p); err == nil {
			clis = append(clis, p)
		}
	}
	if p, err := exec.LookPath("docker"); err == nil {
		if abs, err := filepath.EvalSymlinks(p); err == nil && !slices.Contains(clis, abs) {
			clis = append(clis, abs)
		}
	}
	if len(clis) == 0 {
		t.Fatal("no Docker CLI: install Debian's docker.io (apt-get install docker.io), as .ci/run does")
	}
	return clis
}

// dockerSocket is the Docker API socket of a stoke up on dataDir.
func dockerSocket(dataDir string) string { return filepath.Join(dataDir, "docker", "docker.sock") }

// dockerCLI runs one Docker CLI against a stoke up's socket.
type dockerCLI struct {
	t    *testing.T
	bin  string
	host string
	// env is more of the CLI's environment (DOCKER_TLS_VERIFY, ...).
	env []string
}

func (d dockerCLI) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(append(os.Environ(), "DOCKER_HOST="+d.host, "DOCKER_CONFIG="+d.t.TempDir()), d.env...)
	return cmd
}

// run runs the CLI with stdin and returns stdout, stderr and the exit code.
func (d dockerCLI) run(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := d.cmd(args...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return out.String(), errOut.String(), exit.ExitCode()
	case err != nil:
		d.t.Fatalf("docker %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), 0
}

// ok runs the CLI and asserts exit 0; it returns stdout.
func (d dockerCLI) ok(args ...string) string {
	d.t.Helper()
	out, errOut, code := d.run("", args...)
	if code != 0 {
		d.t.Fatalf("docker %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// awaitLogLine follows a container's logs until a line equals want.
func (d dockerCLI) awaitLogLine(id, want string) {
	d.t.Helper()
	cmd := d.cmd("logs", "-f", id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if sc.Text() == want {
			return
		}
	}
	d.t.Fatalf("docker logs -f %s ended without the line %q", id, want)
}

// TestDockerCLI drives stoke up's Docker API with the real Docker CLIs:
// each container is a task Run, exec goes through the Exec service.
func TestDockerCLI(t *testing.T) {
	clis := dockerCLIs(t)
	up := startUp(t, t.TempDir())
	for _, bin := range clis {
		d := dockerCLI{t: t, bin: bin, host: "unix://" + dockerSocket(up.DataDir)}
		version := strings.TrimSpace(d.ok("version", "-f", "{{.Client.APIVersion}}"))
		t.Run("api-"+version, func(t *testing.T) {
			d.t = t
			testDockerCLI(t, up, d, "v"+strings.ReplaceAll(version, ".", "-"))
		})
	}
}

func testDockerCLI(t *testing.T, up *stokeUp, d dockerCLI, tag string) {
	t.Run("RunRm", func(t *testing.T) {
		d.t = t
		if out := d.ok("run", "--rm", "bash", "echo", "hello"); out != "hello\n" {
			t.Errorf("stdout %q, want hello", out)
		}
		out, errOut, code := d.run("", "run", "--rm", "bash", "sh", "-c", "echo out; echo err >&2; exit 3")
		if out != "out\n" || !strings.Contains(errOut, "err\n") || code != 3 {
			t.Errorf("got stdout %q stderr %q exit %d, want out, err and 3", out, errOut, code)
		}
		if out := d.ok("run", "--rm", "python:3", "python", "-c", "print(1 + 1)"); out != "2\n" {
			t.Errorf("python: stdout %q, want 2", out)
		}
		if left := d.ok("ps", "-aq"); left != "" {
			t.Errorf("containers left after run --rm: %q", left)
		}
	})
	t.Run("UnknownImage", func(t *testing.T) {
		d.t = t
		_, errOut, code := d.run("", "run", "--rm", "no-such-image:1", "true")
		if code == 0 || !strings.Contains(errOut, "No such image") {
			t.Errorf("exit %d, stderr %q: want a failure naming No such image", code, errOut)
		}
	})
	t.Run("DetachedLogsWait", func(t *testing.T) {
		d.t = t
		name := "logs-" + tag
		id := strings.TrimSpace(d.ok("run", "-d", "--name", name, "-l", "suite="+tag, "python:3", "python3", "-c",
			"import sys\nfor i in range(3): print(i, flush=True)\nprint('e', file=sys.stderr)\nraise SystemExit(4)"))
		if out := d.ok("logs", "-f", id); out != "0\n1\n2\n" {
			t.Errorf("logs -f: %q", out)
		}
		if out := d.ok("wait", id); out != "4\n" {
			t.Errorf("wait: %q, want 4", out)
		}
		// The last two lines of both streams (whose order between each
		// other is the pumps'): stdout ends with 2.
		if out, errOut, _ := d.run("", "logs", "--tail", "2", name); strings.Count(out+errOut, "\n") != 2 || !strings.HasSuffix(out, "2\n") {
			t.Errorf("logs --tail 2: stdout %q stderr %q, want two lines, stdout ending with 2", out, errOut)
		}
		if _, errOut, _ := d.run("", "logs", name); errOut != "e\n" {
			t.Errorf("logs: stderr %q, want e", errOut)
		}
		if out := d.ok("inspect", "-f", "{{.State.ExitCode}} {{.State.Running}} {{.State.OOMKilled}} {{.State.Status}}", name); out != "4 false false exited\n" {
			t.Errorf("inspect: %q", out)
		}
		if out := d.ok("ps", "-a", "--filter", "label=suite="+tag, "--filter", "status=exited", "--format", "{{.Names}}"); out != name+"\n" {
			t.Errorf("ps -a --filter: %q, want %s", out, name)
		}
		// The container is a task Run, with its name, labels and exit code.
		run := up.getRun(t, name)
		if run.Spec.Runtime != "python" || run.Labels["suite"] != tag || run.Status.ExitCode == nil || *run.Status.ExitCode != 4 {
			t.Errorf("its Run: runtime %s labels %v exit %v", run.Spec.Runtime, run.Labels, run.Status.ExitCode)
		}
		d.ok("rm", name)
		if status, _ := up.do(t, http.MethodGet, "/v1/namespaces/default/runs/"+name, nil); status != http.StatusNotFound {
			t.Errorf("get run after docker rm: %d, want 404", status)
		}
	})
	t.Run("StokeRunsInPs", func(t *testing.T) {
		d.t = t
		name := "stoke-task-" + tag
		up.createRun(t, newRun(name, v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}))
		if out := d.ok("wait", name); out != "0\n" {
			t.Errorf("wait: %q", out)
		}
		if out := d.ok("ps", "-a", "--filter", "name="+name, "--format", "{{.Names}} {{.Image}}"); out != name+" stoke/bash\n" {
			t.Errorf("ps -a: %q", out)
		}
		d.ok("rm", name)
	})
	t.Run("Exec", func(t *testing.T) {
		d.t = t
		id := strings.TrimSpace(d.ok("run", "-d", "bash", "sh", "-c", "echo ready; exec sleep 600"))
		defer d.ok("rm", "-f", id)
		d.awaitLogLine(id, "ready")
		// stdin to its EOF, then the output to its end.
		out, _, code := d.run("one\ntwo\n", "exec", "-i", id, "sh", "-c", "cat; echo done")
		if out != "one\ntwo\ndone\n" || code != 0 {
			t.Errorf("exec -i: %q exit %d", out, code)
		}
		if _, _, code := d.run("", "exec", id, "sh", "-c", "exit 7"); code != 7 {
			t.Errorf("exec exit: %d, want 7", code)
		}
		testExecTTY(t, d, id)
		testCopy(t, d, id)
	})
	t.Run("RunInteractive", func(t *testing.T) {
		d.t = t
		testRunInteractive(t, d, tag)
	})
	t.Run("EventsStats", func(t *testing.T) {
		d.t = t
		testEventsStats(t, d, tag)
	})
	t.Run("KillStopRm", func(t *testing.T) {
		d.t = t
		id := strings.TrimSpace(d.ok("run", "-d", "bash", "sh", "-c",
			`trap 'echo got-usr1' USR1; trap '' TERM; echo ready; while :; do sleep 0.05; done`))
		d.awaitLogLine(id, "ready")
		d.ok("kill", "-s", "USR1", id)
		d.awaitLogLine(id, "got-usr1")
		// SIGTERM is ignored: stop kills it after its timeout.
		d.ok("stop", "-t", "1", id)
		if out := d.ok("inspect", "-f", "{{.State.ExitCode}} {{.State.Running}}", id); out != "137 false\n" {
			t.Errorf("after stop: %q, want 137 false", out)
		}
		d.ok("rm", id)
		id = strings.TrimSpace(d.ok("run", "-d", "bash", "sleep", "600"))
		if _, errOut, code := d.run("", "rm", id); code == 0 || !strings.Contains(errOut, "is running") {
			t.Errorf("rm of a running container: exit %d %q", code, errOut)
		}
		d.ok("rm", "-f", id)
		if out := d.ok("ps", "-aq", "--filter", "id="+id); out != "" {
			t.Errorf("after rm -f: %q", out)
		}
	})
}

// testEventsStats reads a container's life from `docker events` (--since
// replays, then it follows; --until ends it) and a busy container's CPU,
// memory and processes from `docker stats --no-stream`.
func testEventsStats(t *testing.T, d dockerCLI, tag string) {
	since := strconv.FormatInt(time.Now().Unix()-1, 10)
	name := "events-" + tag
	if _, errOut, code := d.run("", "run", "--rm", "--name", name, "-l", "suite=events", "bash", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("docker run: exit %d, want 3 (%s)", code, errOut)
	}
	follow := d.cmd("events", "--since", since, "--filter", "container="+name, "--filter", "label=suite=events", "--format", "{{.Action}} {{.Actor.Attributes.exitCode}}")
	out, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	var actions []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		actions = append(actions, strings.TrimSpace(strings.TrimSuffix(sc.Text(), "<no value>")))
		if strings.HasPrefix(sc.Text(), "destroy") {
			break
		}
	}
	_ = follow.Process.Kill()
	_ = follow.Wait()
	if got := strings.Join(actions, ","); got != "create,start,die 3,destroy" {
		t.Errorf("docker events: %q, want create,start,die 3,destroy", got)
	}
	// --until ends the stream with what came before it.
	until := strconv.FormatInt(time.Now().Unix()+1, 10)
	if out := d.ok("events", "--since", since, "--until", until, "--filter", "container="+name, "--filter", "event=create", "--format", "{{.Action}} {{.Actor.Attributes.name}}"); out != "create "+name+"\n" {
		t.Errorf("docker events --until: %q", out)
	}

	busy := "busy-" + tag
	d.ok("run", "-d", "--name", busy, "bash", "sh", "-c", "while :; do :; done")
	defer d.ok("rm", "-f", busy)
	line := strings.Fields(d.ok("stats", "--no-stream", "--format", "{{.Name}} {{.CPUPerc}} {{.MemUsage}} {{.PIDs}}", busy))
	if len(line) < 4 || line[0] != busy {
		t.Fatalf("docker stats: %q", line)
	}
	cpu, err := strconv.ParseFloat(strings.TrimSuffix(line[1], "%"), 64)
	if err != nil || cpu <= 0 {
		t.Errorf("docker stats: CPU %q of a busy loop, want more than 0 %%", line[1])
	}
	if strings.HasPrefix(line[2], "0B") || line[len(line)-1] != "1" {
		t.Errorf("docker stats: memory %q, processes %q: want some memory and 1 process", line[2], line[len(line)-1])
	}
}

// testExecTTY runs `docker exec -it` under a pseudo-terminal: the size
// and a resize reach the session (stty size), Ctrl-C interrupts its
// foreground job, and its exit status is the CLI's.
func testExecTTY(t *testing.T, d dockerCLI, id string) {
	cmd := d.cmd("exec", "-it", id, "sh", "-c",
		`trap 'echo interrupted' INT; stty size; while :; do read l || continue; case $l in q) exit 3;; s) echo sleeping; sleep 600;; *) stty size;; esac; done`)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 33, Cols: 91})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(ptmx)
		for sc.Scan() {
			// Nothing but the session's output: no stray byte (a NUL
			// was once seen here and stripped).
			if strings.IndexByte(sc.Text(), 0) >= 0 {
				t.Errorf("exec -it output holds a NUL byte: %q", sc.Text())
			}
			lines <- strings.TrimSpace(sc.Text())
		}
	}()
	// await reads lines until one ends with want; poke, when set, is
	// called after each other line and every half second.
	await := func(want string, poke func()) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		again := time.NewTicker(500 * time.Millisecond)
		defer again.Stop()
		for {
			select {
			case <-again.C:
				if poke != nil {
					poke()
				}
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("exec -it ended before %q", want)
				}
				if strings.HasSuffix(l, want) {
					return
				}
				if poke != nil && l != "" {
					poke()
				}
			case <-deadline:
				t.Fatalf("exec -it: no %q", want)
			}
		}
	}
	// The CLI sends the size when it started the session (an API 1.41
	// client has no ConsoleSize: its resize may come after the first stty)
	// and when SIGWINCH reaches it, which may be before it listens for it:
	// each poke signals it again and asks for the size again, until the
	// size shows.
	poke := func() {
		_ = cmd.Process.Signal(syscall.SIGWINCH)
		fmt.Fprint(ptmx, "\r")
	}
	await("33 91", poke)
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	poke()
	await("40 120", poke)
	fmt.Fprint(ptmx, "s\r")
	await("sleeping", nil)
	// Ctrl-C until the foreground job is interrupted: a ^C that comes
	// before sleep started interrupts read, which the loop reads again.
	await("interrupted", func() { fmt.Fprint(ptmx, "\x03") })
	fmt.Fprint(ptmx, "q\r")
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("exec -it ended with %v, want exit 3", err)
	}
	_, _ = io.Copy(io.Discard, ptmx)
}

// testCopy copies a directory tree into a container and back (docker cp
// both ways): the files' SHA-256 sums are equal; paths that leave the
// working directory are refused.
func testCopy(t *testing.T, d dockerCLI, id string) {
	src := filepath.Join(t.TempDir(), "tree")
	files := map[string][]byte{"a": bytes.Repeat([]byte("0123456789"), 100_000), "sub/b": []byte("b\n"), "sub/deeper/c": {0, 1, 2, 255}}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.ok("cp", src, id+":.")
	back := filepath.Join(t.TempDir(), "back")
	d.ok("cp", id+":tree", back)
	for name, data := range files {
		got, err := os.ReadFile(filepath.Join(back, name))
		if err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
			t.Errorf("%s after docker cp both ways: %d bytes, %v", name, len(got), err)
		}
	}
	d.ok("exec", id, "ln", "-s", "/", "escape")
	for _, bad := range [][]string{
		{id + ":/etc/passwd", t.TempDir()},
		{id + ":../", t.TempDir()},
		{id + ":escape/etc/passwd", t.TempDir()},
		{src, id + ":escape/tmp"},
	} {
		if _, errOut, code := d.run("", append([]string{"cp"}, bad...)...); code == 0 {
			t.Errorf("docker cp %v: exit 0, want a refusal (%s)", bad, errOut)
		}
	}
}
