package up_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/debugsock"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/pool"
	"stoke.dev/stoke/internal/up"
)

// listen serves profiles on path until the test ends.
func listen(t *testing.T, path string) {
	t.Helper()
	s, err := debugsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
}

// leaveStale leaves at path what a process killed with SIGKILL leaves: a
// socket file nobody listens on.
func leaveStale(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// FindDebugSocket names stoke up, a pod by its name, a Runtime by its
// name when it has one live pod, or a Run by its name (for its pod),
// among the sockets in a data directory; a file that is not a socket, or
// a pod without one, is not listed; a stale socket is listed as such and
// refused, saying its process is gone.
func TestFindDebugSocket(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pod := func(name string) string { return filepath.Join(dir, "pods", name, pool.DebugSocketName) }

	if _, err := up.FindDebugSocket(ctx, dir, "", nil); err == nil || !strings.Contains(err.Error(), "no debug socket in") {
		t.Fatalf("an empty data directory: %v", err)
	}
	for _, name := range []string{"python-ab12c", "python-zz999", "bash-00000", "python-extra-abcde"} {
		listen(t, pod(name))
	}
	leaveStale(t, pod("node-dead1"))
	leaveStale(t, pod("bash-dead2"))
	if err := os.MkdirAll(filepath.Join(dir, "pods", "bash-nosck"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pods", "bash-nosck", pool.DebugSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := up.FindDebugSocket(ctx, dir, "up", nil); err == nil || !strings.Contains(err.Error(), "pass --socket") {
		t.Fatalf("stoke up without its socket: %v", err)
	}
	listen(t, datadir.DebugSocket(dir))

	socks, err := up.DebugSockets(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range socks {
		got = append(got, s.Process+" "+s.State())
	}
	want := []string{"up live", "bash-00000 live", "bash-dead2 stale", "node-dead1 stale", "python-ab12c live", "python-extra-abcde live", "python-zz999 live"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("DebugSockets: %q, want %q", got, want)
	}

	runPod := func(_ context.Context, run string) (string, error) {
		switch run {
		case "pyfn":
			return "python-zz999", nil
		case "nodefn":
			return "node-dead1", nil
		case "elsewhere":
			return "ruby-abcde", nil
		case "pending":
			return "", errors.New("run default/pending (uid u1) is Pending and on no pod")
		case "down":
			return "", errors.New("cannot reach the Stoke server")
		}
		return "", errdefs.Errorf(errdefs.ErrNotFound, "run %s", run)
	}
	for process, want := range map[string]string{
		"":                   datadir.DebugSocket(dir),
		"up":                 datadir.DebugSocket(dir),
		"python-zz999":       pod("python-zz999"),
		"bash":               pod("bash-00000"), // bash-dead2 is stale
		"python-extra":       pod("python-extra-abcde"),
		"python-extra-abcde": pod("python-extra-abcde"),
		"pyfn":               pod("python-zz999"),
	} {
		if got, err := up.FindDebugSocket(ctx, dir, process, runPod); err != nil || got != want {
			t.Errorf("FindDebugSocket(%q) = %q, %v; want %q", process, got, err, want)
		}
	}
	for process, msg := range map[string]string{
		"python":     "runtime python has 2 live pods with a debug socket (python-ab12c, python-zz999): name one",
		"pyth":       `no process or Run "pyth"`,
		"bash-nosck": `no process or Run "bash-nosck"`,
		"node-dead1": "pod node-dead1 is gone: its debug socket " + pod("node-dead1") + " is stale",
		"node":       "runtime node has no live pod: node-dead1 gone",
		"nodefn":     "pod node-dead1 is gone",
		"elsewhere":  "run elsewhere is on pod ruby-abcde, which has no debug socket in " + dir,
		"pending":    "is Pending and on no pod",
		"down":       `looking for a Run "down": cannot reach the Stoke server`,
	} {
		if _, err := up.FindDebugSocket(ctx, dir, process, runPod); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("FindDebugSocket(%q): %v, want %q", process, err, msg)
		}
	}
	if _, err := up.FindDebugSocket(ctx, dir, "pyfn", nil); err == nil || !strings.Contains(err.Error(), `no process "pyfn"`) {
		t.Errorf("a Run's name without the API: %v", err)
	}
}

// A stoke up killed with SIGKILL leaves its socket: it is listed stale and
// refused, saying stoke up is gone.
func TestFindDebugSocketStaleUp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	leaveStale(t, datadir.DebugSocket(dir))
	socks, err := up.DebugSockets(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].Process != up.UpProcess || socks[0].Live {
		t.Fatalf("DebugSockets: %+v, want up, stale", socks)
	}
	if _, err := up.FindDebugSocket(ctx, dir, "", nil); err == nil || !strings.Contains(err.Error(), "stoke up is gone") {
		t.Fatalf("a stale stoke up socket: %v", err)
	}
}
