package kubetest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"stoke.dev/stoke/internal/proc"
)

// A component is one control-plane program of the test cluster, run as a
// child process in its own process group with a parent-death signal (so
// that a test binary that dies leaves none behind) and its output in a log
// file of the cluster's directory.
type component struct {
	name    string
	path    string
	args    []string
	logPath string

	p       *proc.Process // nil until started
	stopped bool          // by stop, not by itself
}

func (c *component) start() error {
	f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	defer f.Close() // the child has its own copy
	cmd := exec.Command(c.path, c.args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := proc.Start(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	c.p, c.stopped = p, false
	return nil
}

// stop kills the component's process group, SIGTERM first and SIGKILL
// after grace, and returns once it has exited.
func (c *component) stop(grace time.Duration) {
	if c.p == nil {
		return
	}
	c.stopped = true
	c.p.Kill(grace)
}

// exited returns a channel closed when the running process exits (never,
// when none was started).
func (c *component) exited() <-chan struct{} {
	if c.p == nil {
		return nil
	}
	return c.p.Done()
}

// died reports an exit that stop did not cause.
func (c *component) died() error {
	if c.p == nil || c.stopped {
		return nil
	}
	select {
	case <-c.p.Done():
		return fmt.Errorf("%s exited by itself (%v); its log: %s", c.name, c.p.Err(), c.logPath)
	default:
		return nil
	}
}

// logTail is the last n lines of the component's log.
func (c *component) logTail(n int) string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
