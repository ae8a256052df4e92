package up_test

import (
	"bufio"
	"crypto/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/testbin"
)

// The invoke benchmark's floor target: the shape of Stoke's invoke path
// (an HTTP process, a gRPC unary call over a Unix socket to a second
// process, a pipe to a persistent python3) with no Stoke code in it, built
// from internal/invokefloor. Its back process runs with GOMAXPROCS=1.

// startFloor builds and starts the floor, whose front (the target's root)
// starts the back, which starts the worker, all in one process group that
// the benchmark's cleanup kills.
func startFloor(b *testing.B, interp, handlerDir string) *invokeTarget {
	bin, cleanup, err := testbin.Build("stoke.dev/stoke/internal/invokefloor/cmd/invokefloor", "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cleanup)
	sockDir := filepath.Join(b.TempDir(), "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		b.Fatal(err)
	}
	token := rand.Text()
	cmd := exec.Command(bin, "front", "-socket-dir", sockDir, "-python", interp,
		"-handler-dir", handlerDir, "-module", "echo", "-back-gomaxprocs", "1")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "INVOKEFLOOR_TOKEN=" + token}
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	cmd.Stdout = w
	pid := startPeer(b, cmd)
	w.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		b.Fatalf("the floor did not start: %q %v", line, err)
	}
	return &invokeTarget{name: "floor", url: "http://" + addr, body: benchInput,
		header: http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}},
		root:   pid, roleOf: floorRole}
}

// floorRole tells the front from the back and the worker, as stokeRole
// tells stoke up from its pods and their workers.
func floorRole(cmdline string, isRoot bool) string {
	switch {
	case isRoot:
		return "server"
	case strings.HasSuffix(strings.SplitN(cmdline, "\x00", 2)[0], "/invokefloor"):
		return "pod"
	default:
		return "worker"
	}
}
