package up_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/debugsock"
	"stoke.dev/stoke/internal/pool"
	"stoke.dev/stoke/internal/up"
)

// FindDebugSocket names stoke up, a pod by its name, or a Runtime by its
// name when it has one pod, among the sockets that serve in a data
// directory; a stale file that is not a socket, or a pod without one, is
// not listed.
func TestFindDebugSocket(t *testing.T) {
	dir := t.TempDir()
	listen := func(path string) {
		s, err := debugsock.Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
	}
	pod := func(name string) string { return filepath.Join(dir, "pods", name, pool.DebugSocketName) }

	if _, err := up.FindDebugSocket(dir, ""); err == nil || !strings.Contains(err.Error(), "no debug socket in") {
		t.Fatalf("an empty data directory: %v", err)
	}
	for _, name := range []string{"python-ab12c", "python-zz999", "bash-00000", "python-extra-abcde"} {
		listen(pod(name))
	}
	if err := os.MkdirAll(filepath.Join(dir, "pods", "bash-nosck"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pods", "bash-nosck", pool.DebugSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := up.FindDebugSocket(dir, "up"); err == nil || !strings.Contains(err.Error(), "pass --socket") {
		t.Fatalf("stoke up without its socket: %v", err)
	}
	listen(datadir.DebugSocket(dir))

	socks, err := up.DebugSockets(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range socks {
		names = append(names, s.Process)
	}
	if want := []string{"up", "bash-00000", "python-ab12c", "python-extra-abcde", "python-zz999"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("DebugSockets: %q, want %q", names, want)
	}

	for process, want := range map[string]string{
		"":                   datadir.DebugSocket(dir),
		"up":                 datadir.DebugSocket(dir),
		"python-zz999":       pod("python-zz999"),
		"bash":               pod("bash-00000"),
		"python-extra":       pod("python-extra-abcde"),
		"python-extra-abcde": pod("python-extra-abcde"),
	} {
		if got, err := up.FindDebugSocket(dir, process); err != nil || got != want {
			t.Errorf("FindDebugSocket(%q) = %q, %v; want %q", process, got, err, want)
		}
	}
	for process, msg := range map[string]string{
		"python":     "runtime python has 2 pods with a debug socket (python-ab12c, python-zz999): name one",
		"pyth":       `no process "pyth"`,
		"bash-nosck": `no process "bash-nosck"`,
	} {
		if _, err := up.FindDebugSocket(dir, process); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("FindDebugSocket(%q): %v, want %q", process, err, msg)
		}
	}
}
