package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/testbin"
)

// upFails runs `stoke up` with args, which must exit non-zero within a
// bound, and returns its stderr.
func upFails(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, stokeBin, append([]string{"up"}, args...)...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("stoke up %q did not exit within the bound; output:\n%s", args, out)
	}
	if err == nil {
		t.Fatalf("stoke up %q exited 0; output:\n%s", args, out)
	}
	return string(out)
}

// A second `stoke up` on a served data directory says who serves it, and
// one on a free directory but a port in use says so too; neither disturbs
// the first. A data directory that others can read is refused with the
// command that fixes it.
func TestUpRefusesABusyDataDirectoryOrPortAndAPublicDirectory(t *testing.T) {
	dir := t.TempDir()
	u := startUp(t, dir)
	addr, err := url.Parse(u.URL)
	if err != nil {
		t.Fatal(err)
	}

	out := upFails(t, "--data-dir", dir, "--listen", "127.0.0.1:0")
	if want := fmt.Sprintf("another stoke up (pid %d) serves this data directory", u.Pid); !strings.Contains(out, want) {
		t.Errorf("second stoke up on the same data directory said:\n%s\nwant %q", out, want)
	}
	out = upFails(t, "--data-dir", filepath.Join(t.TempDir(), "other"), "--listen", addr.Host)
	if want := addr.Host + " is in use by another program"; !strings.Contains(out, want) {
		t.Errorf("stoke up on a port in use said:\n%s\nwant %q", out, want)
	}
	if status, body := u.do(t, "GET", "/v1/namespaces/default/runs", nil); status != 200 {
		t.Errorf("the first stoke up after the refused starts: %d %s", status, body)
	}

	public := filepath.Join(t.TempDir(), "public")
	if err := os.Mkdir(public, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(public, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	out = upFails(t, "--data-dir", public, "--listen", "127.0.0.1:0")
	if want := "chmod 700 " + public; !strings.Contains(out, want) {
		t.Errorf("stoke up on a data directory of mode 0755 said:\n%s\nwant %q", out, want)
	}
	if _, err := os.Stat(filepath.Join(public, "token")); err == nil {
		t.Errorf("stoke up wrote its token into the refused data directory")
	}
	u.stop(t)
}

// `go run ./cmd/stoke up`, the quickest way to try Stoke, stopped by the
// pid a user sees — the go command's — stops the server too, cleanly, and
// leaves nothing running.
func TestGoRunUpStopsWithTheGoCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := testbin.RunsCanPass(dir); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "stoke.dev/stoke/cmd/stoke", "up", "--data-dir", dir, "--listen", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Our own pipe: the server holds its write end after go has exited.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	serving, pumped := make(chan struct{}), make(chan struct{})
	var stopping atomic.Bool
	var other []string // lines that are not the server's log: go's own
	go func() {
		defer close(pumped)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := false
		for sc.Scan() {
			var rec struct{ Msg string }
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				if len(other) < 20 {
					other = append(other, sc.Text())
				}
				continue
			}
			switch {
			case rec.Msg == "serving" && !once:
				once = true
				close(serving)
			case rec.Msg == "stopping":
				stopping.Store(true)
			}
		}
	}()
	t.Cleanup(func() {
		// A failed test leaves nothing behind: the whole group, then
		// whatever refers to the data directory.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		for _, p := range processesUnder(dir) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		r.Close()
		<-pumped
	})
	select {
	case <-serving:
	case <-exited:
		<-pumped
		t.Fatalf("go run exited before serving: %v\n%s", waitErr, strings.Join(other, "\n"))
	case <-time.After(5 * time.Minute): // go run builds first, on a loaded machine
		t.Fatal("go run ./cmd/stoke up did not serve within 5 minutes")
	}
	// The server is go's own child; its pods, its children, show its
	// command line too between their fork and their exec.
	var server []process
	for _, p := range descendants(cmd.Process.Pid) {
		if p.ppid == cmd.Process.Pid && len(p.cmdline) > 1 && p.cmdline[1] == "up" {
			server = append(server, p)
		}
	}
	if len(server) != 1 {
		t.Fatalf("want one stoke up under go run, found:\n%s", describeProcesses(descendants(cmd.Process.Pid)))
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-exited
	if left := awaitGone(60*time.Second, func() []process { return stillAlive(server) }); len(left) > 0 {
		t.Fatalf("stoke up still runs after its go run got SIGTERM:\n%s", describeProcesses(left))
	}
	if left := awaitNoProcessesUnder(dir, 10*time.Second); len(left) > 0 {
		t.Fatalf("processes left after go run's stoke up stopped:\n%s", describeProcesses(left))
	}
	select {
	case <-pumped: // every writer of the log is gone
	case <-time.After(10 * time.Second):
		t.Fatal("stoke up's stderr still open after it exited")
	}
	if !stopping.Load() {
		t.Errorf("stoke up did not log a clean stop")
	}
}
