package testbin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Bounds on waiting for a `stoke up`.
const (
	serveBound = 60 * time.Second // from start to its "serving" line
	stopBound  = 60 * time.Second // from SIGTERM to its exit
	reapBound  = 10 * time.Second // from SIGKILL to its reaping
)

// logLines is how much of a `stoke up`'s log Up keeps.
const logLines = 50

// Up is a running `stoke up` child process serving its HTTP API on a free
// loopback port. It runs in a process group of its own, and has a
// parent-death signal (SIGKILL) so that a test process that crashes does
// not leave it running.
type Up struct {
	URL     string // from its "serving" log line
	Token   string // from DataDir/token
	DataDir string
	Cmd     *exec.Cmd
	Pid     int

	exited  chan struct{} // closed once the process is reaped
	waitErr error         // Cmd.Wait's result, read after exited

	stderr   *os.File      // the read end of its stderr
	pumped   chan struct{} // closed once stderr is read to its end
	released sync.Once     // of stderr

	logMu sync.Mutex
	log   []string // the last logLines lines of its stderr

	stderrBytes atomic.Int64 // read from its stderr so far
}

// StartUp runs `bin up --data-dir dataDir --listen 127.0.0.1:0 extra...`
// and returns once it has logged the URL it serves and its token is in
// dataDir/token. Whoever gets an Up must end it with Stop or Close.
func StartUp(bin, dataDir string, extra ...string) (*Up, error) {
	return StartUpAs(nil, nil, bin, dataDir, extra...)
}

// StartUpAs is StartUp with stoke up started as cred's user (nil: as this
// process) and with env as its environment (nil: this process's).
func StartUpAs(cred *syscall.Credential, env []string, bin, dataDir string, extra ...string) (*Up, error) {
	// A test's temporary directory has mode 0755 under the usual umask;
	// stoke up refuses a data directory that is not private.
	if err := os.Chmod(dataDir, 0o700); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stoke up: %w", err)
	}
	if err := RunsCanPass(dataDir); err != nil {
		return nil, fmt.Errorf("stoke up: %w", err)
	}
	cmd := exec.Command(bin, append([]string{"up", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, extra...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	cmd.Env = env
	// Our own pipe rather than StderrPipe: Cmd.Wait must not depend on
	// everything that might hold the write end having closed it.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stoke up: %w", err)
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("start stoke up: %w", err)
	}
	u := &Up{DataDir: dataDir, Cmd: cmd, Pid: cmd.Process.Pid, exited: make(chan struct{}), stderr: r, pumped: make(chan struct{})}
	go func() {
		u.waitErr = cmd.Wait()
		close(u.exited)
	}()
	urlc := make(chan string, 1)
	go u.pump(urlc)

	fail := func(format string, args ...any) (*Up, error) {
		_ = u.Close()
		err := fmt.Errorf(format, args...)
		if log := u.Log(); len(log) > 0 {
			err = fmt.Errorf("%w; its log ends:\n%s", err, strings.Join(log, "\n"))
		}
		return nil, err
	}
	select {
	case u.URL = <-urlc:
	case <-u.exited:
		return fail("stoke up exited before serving: %v", u.waitErr)
	case <-time.After(serveBound):
		return fail("stoke up did not log that it serves within %v", serveBound)
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, "token"))
	if err != nil {
		return fail("stoke up: %w", err)
	}
	if u.Token = strings.TrimSpace(string(tok)); u.Token == "" {
		return fail("stoke up: empty token file")
	}
	return u, nil
}

// pump reads stoke up's stderr to its end, keeping its last lines and
// delivering the URL of the first "serving" line.
func (u *Up) pump(urlc chan<- string) {
	defer close(u.pumped)
	sc := bufio.NewScanner(countingReader{u.stderr, &u.stderrBytes})
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		u.keep(sc.Text())
		var rec struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
			select {
			case urlc <- rec.URL:
			default:
			}
		}
	}
	// A line too long for the scanner: keep draining, so that nothing
	// blocks writing to the pipe.
	_, _ = io.Copy(io.Discard, countingReader{u.stderr, &u.stderrBytes})
}

// StderrBytes is how many bytes stoke up has written to its stderr so far
// (as far as they have been read: a line still in the pipe is not
// counted).
func (u *Up) StderrBytes() int64 { return u.stderrBytes.Load() }

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (u *Up) keep(line string) {
	u.logMu.Lock()
	defer u.logMu.Unlock()
	if len(u.log) == logLines {
		u.log = append(u.log[:0], u.log[1:]...)
	}
	u.log = append(u.log, line)
}

// Log returns the last lines (at most 50) stoke up wrote to its stderr.
func (u *Up) Log() []string {
	u.logMu.Lock()
	defer u.logMu.Unlock()
	return append([]string(nil), u.log...)
}

// Exited is closed once the process has exited and been reaped.
func (u *Up) Exited() <-chan struct{} { return u.exited }

// Wait waits for the process to exit and returns Cmd.Wait's result.
func (u *Up) Wait() error {
	<-u.exited
	return u.waitErr
}

// Stop sends SIGTERM and waits, at most a minute, for stoke up to exit,
// which it must do with status 0. Past the bound it kills the process
// group. Either way it then stops reading stoke up's stderr.
func (u *Up) Stop() error {
	if err := u.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stoke up: SIGTERM: %w", err)
	}
	select {
	case <-u.exited:
	case <-time.After(stopBound):
		return errors.Join(fmt.Errorf("stoke up did not exit within %v of SIGTERM", stopBound), u.Close())
	}
	u.releaseStderr()
	if u.waitErr != nil {
		return fmt.Errorf("stoke up after SIGTERM: %w, want exit status 0", u.waitErr)
	}
	return nil
}

// Kill9 sends SIGKILL to the stoke up process alone, not its group — a
// crash, as its pods see it — and waits for it to be reaped. Its stderr
// is still read: Close stops that.
func (u *Up) Kill9() error {
	if err := u.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("stoke up: SIGKILL: %w", err)
	}
	select {
	case <-u.exited:
		return nil
	case <-time.After(reapBound):
		return fmt.Errorf("stoke up not reaped within %v of SIGKILL", reapBound)
	}
}

// Close kills stoke up's process group if the process still runs, waits
// for it to be reaped, and stops reading its stderr. It may be called
// more than once, and after Stop or Kill9.
func (u *Up) Close() error {
	select {
	case <-u.exited:
	default:
		_ = syscall.Kill(-u.Pid, syscall.SIGKILL)
		select {
		case <-u.exited:
		case <-time.After(reapBound):
			return fmt.Errorf("stoke up not reaped within %v of SIGKILL to its group", reapBound)
		}
	}
	u.releaseStderr()
	return nil
}

// releaseStderr waits, at most a second, for stoke up's stderr to reach
// its end (its last lines are then kept), then closes it: a process it
// started may still hold the write end.
func (u *Up) releaseStderr() {
	u.released.Do(func() {
		select {
		case <-u.pumped:
		case <-time.After(time.Second):
		}
		u.stderr.Close()
		<-u.pumped
	})
}

// RunsCanPass lets others pass through (not list) every directory above
// path that lies in the temporary directory, when this process is root:
// a root stoke up runs its Runs as an unprivileged user, which must pass
// through every directory above the data directory, and a test's
// t.TempDir lies below a directory of mode 0700. Nothing otherwise.
func RunsCanPass(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	tmp := filepath.Clean(os.TempDir()) + string(filepath.Separator)
	for p := filepath.Dir(abs); strings.HasPrefix(p, tmp); p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o001 == 0 {
			if err := os.Chmod(p, perm|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}
