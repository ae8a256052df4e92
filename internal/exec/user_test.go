package exec_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/runuser"
)

// With a User (a Runtime Server running as root), a session's command
// runs as that user without supplementary groups, with and without a
// TTY, and its terminal is the user's, so that a program that opens it by
// name can. Without one (a server that is not root) it runs as the server.
func TestLocalRunsAsTheUser(t *testing.T) {
	var u *runuser.User
	want := strconv.Itoa(os.Geteuid())
	if os.Geteuid() == 0 {
		u = &runuser.User{UID: runuser.DefaultID, GID: runuser.DefaultID}
		want = strconv.Itoa(runuser.DefaultID)
	}
	dir := t.TempDir()
	// The session's working directory is the user's, as a Run's is.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := u.Give(dir); err != nil {
		t.Fatal(err)
	}
	l := exec.NewLocal(exec.LocalConfig{Targets: dirTargets{dir: dir, ended: make(chan struct{})}, User: u})
	defer l.Close()
	for _, tty := range []bool{false, true} {
		script := "id -u; id -G"
		if tty {
			// Opened by name, as tty(1), ssh or sudo do.
			script += "; echo ok > $(tty) && echo tty-ok"
		}
		sess, err := l.Start(context.Background(), exec.Request{RunUID: "run", Command: []string{"sh", "-c", script}, TTY: tty})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		exit, err := sess.Stream(context.Background(), exec.Streams{Stdout: &out, Stderr: &out})
		sess.Close()
		if err != nil || exit.Code != 0 {
			t.Fatalf("tty %v: exit %v %v: %q", tty, exit, err, out.String())
		}
		lines := strings.Fields(strings.ReplaceAll(out.String(), "\r", ""))
		wantLines := []string{want, want}
		if u == nil {
			wantLines = lines[:2] // groups: the server's own
			wantLines[0] = want
		}
		if tty {
			wantLines = append(wantLines, "ok", "tty-ok")
		}
		if strings.Join(lines, " ") != strings.Join(wantLines, " ") {
			t.Errorf("tty %v: the command printed %q; want %q", tty, lines, wantLines)
		}
	}
}
