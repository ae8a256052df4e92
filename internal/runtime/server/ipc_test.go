package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/shm"
)

// ipcHarness's one handler answers with the path of its $STOKE_OUTPUTS,
// which lies in the registration's IPC directory.
var ipcHarness = runtimetest.Harness{Runtime: "bash", Fixtures: func(runtimetest.Fixture) runtimetest.Source {
	return runtimetest.Source{Files: map[string]string{"handler.sh": `handle() { printf '"%s"' "$STOKE_OUTPUTS"; }`}, Handler: "handler.handle"}
}}

// outputsPath registers a function on s under uid and returns the
// $STOKE_OUTPUTS its invocation sees.
func outputsPath(t *testing.T, s *runtimetest.Server, uid string) (string, *pb.FunctionRegistration) {
	t.Helper()
	reg := s.Register(t, runtimetest.Echo, uid)
	resp, err := s.Invoke(context.Background(), reg, `{}`, 0)
	if err != nil {
		t.Fatal(err)
	}
	var path string
	if err := json.Unmarshal(resp.GetOutput(), &path); err != nil {
		t.Fatalf("%q: %v", resp.GetOutput(), err)
	}
	return path, reg
}

// By default a Runtime Server keeps the Bash request files and FIFOs in a
// private directory of its own on /dev/shm (in its state directory where
// /dev/shm is no writable tmpfs), each registration in its own directory
// there, removed with the registration and the whole at exit.
func TestIPCDirectoryDefaultsToShm(t *testing.T) {
	var root string
	t.Cleanup(func() { // runs after the server's own cleanup has stopped it
		if _, err := os.Lstat(root); !os.IsNotExist(err) {
			t.Errorf("IPC directory %s left after the server exited: %v", root, err)
		}
	})
	var stateDir string
	s := runtimetest.StartServer(t, ipcHarness, func(c *server.Config) { stateDir = c.StateDir })
	want := stateDir
	if shm.Usable() {
		want = shm.Root
	}
	path, reg := outputsPath(t, s, "ipc-default")
	// <root>/<registration>/bash-<nonce>/outputs.N
	regDir := filepath.Dir(filepath.Dir(path))
	root = filepath.Dir(regDir)
	if filepath.Dir(root) != want || !strings.HasPrefix(filepath.Base(root), "stoke-ipc-") {
		t.Fatalf("$STOKE_OUTPUTS is %s, not in a stoke-ipc- directory in %s", path, want)
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("IPC directory %s: %v %v", root, fi.Mode(), err)
	}
	if _, err := s.Functions.UnregisterFunction(context.Background(), &pb.UnregisterFunctionRequest{Registration: reg, CancelInFlight: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(regDir); !os.IsNotExist(err) {
		t.Errorf("registration IPC directory %s left after unregistering: %v", regDir, err)
	}
}

// --ipc-dir names the directory. The server removes it at exit if it is
// empty then, as a pod's is once its registrations are gone (the pool of a
// stoke up killed with SIGKILL cannot), and leaves one that holds anything
// else.
func TestIPCDirectoryFlag(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(fmt.Sprintf("holding another file %v", other), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ipc")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if other {
				if err := os.WriteFile(filepath.Join(dir, "mine"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { // runs after the server's own cleanup has stopped it
				if _, err := os.Lstat(dir); os.IsNotExist(err) == other {
					t.Errorf("IPC directory %s after the server exited: %v, want it removed only if empty", dir, err)
				}
			})
			s := runtimetest.StartServer(t, ipcHarness, func(c *server.Config) { c.IPCDir = dir })
			path, _ := outputsPath(t, s, "ipc-flag")
			if got := filepath.Dir(filepath.Dir(filepath.Dir(path))); got != dir {
				t.Errorf("$STOKE_OUTPUTS is %s, not in %s", path, dir)
			}
		})
	}
}
