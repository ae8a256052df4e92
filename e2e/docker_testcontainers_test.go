package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// testcontainersSocket returns a path that reaches socket and is the same
// for every run of the test in this process: testcontainers-go resolves
// its Docker host once per process (-count 2 would reach the first run's
// stoke up). It is a link in a directory of the process's own, made 0700
// here (an existing one, someone else's, fails the test).
func testcontainersSocket(t *testing.T, socket string) string {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("stoke-testcontainers-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	link := filepath.Join(dir, "docker.sock")
	if err := os.Symlink(socket, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// TestDockerTestcontainers runs testcontainers-go against stoke up's
// Docker socket, its reaper (Ryuk) turned off: a generic container (bash,
// a log wait strategy), an exec, a file copied in and out, terminate; and
// one (python) with an exec wait strategy.
func TestDockerTestcontainers(t *testing.T) {
	up := startUp(t, t.TempDir())
	t.Setenv("DOCKER_HOST", "unix://"+testcontainersSocket(t, dockerSocket(up.DataDir)))
	t.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	// No ~/.testcontainers.properties of the machine's user.
	t.Setenv("HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:      "bash:5",
			Cmd:        []string{"sh", "-c", "echo starting; echo ready; exec sleep 600"},
			Labels:     map[string]string{"suite": "testcontainers"},
			WaitingFor: wait.ForLog("ready").WithStartupTimeout(time.Minute),
		},
		Started: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	terminated := false
	defer func() {
		if !terminated {
			_ = testcontainers.TerminateContainer(c)
		}
	}()
	code, out, err := c.Exec(ctx, []string{"sh", "-c", "echo from exec; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(out)
	if code != 4 || !strings.Contains(string(b), "from exec") {
		t.Errorf("exec: exit %d output %q, want 4 and 'from exec'", code, b)
	}
	if err := c.CopyToContainer(ctx, []byte("hello\n"), "/data/hello.txt", 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := c.CopyFileFromContainer(ctx, "/data/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(back) != "hello\n" {
		t.Errorf("copied back: %q %v", back, err)
	}
	state, err := c.State(ctx)
	if err != nil || !state.Running {
		t.Errorf("state: %+v %v", state, err)
	}
	terminated = true
	if err := testcontainers.TerminateContainer(c); err != nil {
		t.Fatal(err)
	}
	// An exec wait strategy: testcontainers runs the check and reads its
	// exit code from the exec's inspect until it is 0.
	c2, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:      "python:3",
			Cmd:        []string{"python3", "-c", "import time, pathlib; pathlib.Path('ready').touch(); time.sleep(600)"},
			WaitingFor: wait.ForExec([]string{"test", "-f", "ready"}).WithStartupTimeout(time.Minute),
		},
		Started: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := testcontainers.TerminateContainer(c2); err != nil {
		t.Fatal(err)
	}
	// Its Run is gone, and no reaper was started.
	status, body := up.do(t, http.MethodGet, "/v1/namespaces/default/runs", nil)
	var runs v1alpha1.RunList
	if status != http.StatusOK || json.Unmarshal(body, &runs) != nil || len(runs.Items) != 0 {
		t.Errorf("Runs after terminate: %d %s", status, body)
	}
}
