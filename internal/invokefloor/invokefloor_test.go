package invokefloor_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"stoke.dev/stoke/internal/invokefloor"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/testbin"
)

// echoModule is the handler the floor's worker runs in these tests.
const echoModule = "def handle(event):\n    return {\"echo\": event}\n"

func handlerDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo.py"), []byte(echoModule), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func post(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// TestFrontReachesTheWorker runs the front's handler and the back's server
// in this process, over a real Unix socket, to a real python3 worker.
func TestFrontReachesTheWorker(t *testing.T) {
	worker, err := invokefloor.StartWorker("python3", handlerDir(t), "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := worker.Close(); err != nil {
			t.Error(err)
		}
	}()
	sock := filepath.Join(t.TempDir(), "back.sock")
	ctx, cancel := context.WithCancel(t.Context())
	ready, served := make(chan struct{}), make(chan error, 1)
	go func() { served <- invokefloor.ServeBack(ctx, sock, worker, func() { close(ready) }) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-ready:
	case err := <-served:
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	front := httptest.NewServer(invokefloor.NewFront(conn, "secret"))
	defer front.Close()

	for _, c := range []struct {
		name, token, body string
		code              int
		answer            string
	}{
		{"echo", "secret", `{"a": [1, "é"]}`, http.StatusOK, `{"echo": {"a": [1, "é"]}}`},
		{"again", "secret", `"x"`, http.StatusOK, `{"echo": "x"}`},
		{"no token", "", `{}`, http.StatusUnauthorized, "bad token\n"},
		{"wrong token", "secreT", `{}`, http.StatusUnauthorized, "bad token\n"},
		{"newline", "secret", "{\n}", http.StatusBadRequest, ""},
		{"after the refusals", "secret", `7`, http.StatusOK, `{"echo": 7}`},
	} {
		code, answer := post(t, front.URL, c.token, c.body)
		if code != c.code || (c.answer != "" && answer != c.answer) {
			t.Errorf("%s: %d %q, want %d %q", c.name, code, answer, c.code, c.answer)
		}
	}
	resp, err := http.Get(front.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}

// TestCommandRunsThreeProcesses runs the command as the benchmark does: the
// front, the back with GOMAXPROCS=1 and the worker are three processes,
// and none outlives the front's SIGTERM.
func TestCommandRunsThreeProcesses(t *testing.T) {
	bin, cleanup, err := testbin.Build("stoke.dev/stoke/internal/invokefloor/cmd/invokefloor", "")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	sockDir := filepath.Join(t.TempDir(), "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "front", "-socket-dir", sockDir, "-python", python,
		"-handler-dir", handlerDir(t), "-module", "echo")
	cmd.Env = []string{"INVOKEFLOOR_TOKEN=tok", "PATH=" + os.Getenv("PATH")}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	p, err := proc.Start(cmd, proc.NewSession())
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill(0)
	line, err := bufio.NewReader(r).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		t.Fatalf("front: %q %v", line, err)
	}
	if code, answer := post(t, "http://"+addr, "tok", `{"n":1}`); code != http.StatusOK || answer != `{"echo": {"n": 1}}` {
		t.Fatalf("%d %q", code, answer)
	}

	members, err := proc.SessionMembers(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("session members %v, want the front, the back and the worker", members)
	}
	backs := proc.Children(p.Pid())
	if len(backs) != 1 {
		t.Fatalf("the front's children: %v", backs)
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(backs[0].Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(environ), "\x00"), "GOMAXPROCS=1") {
		t.Errorf("the back's environment has no GOMAXPROCS=1: %q", environ)
	}

	if err := syscall.Kill(p.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := p.Err(); err != nil {
		t.Errorf("front: %v", err)
	}
	// Outside state with no event to await: the worker is killed by its
	// parent's death, after the front has returned.
	deadline := time.Now().Add(10 * time.Second)
	for {
		members, err := proc.SessionMembers(p.Pid())
		if err != nil {
			t.Fatal(err)
		}
		if len(members) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", members)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
