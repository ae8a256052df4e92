package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/internal/kubetest/nodeagent/containerinit"
	"stoke.dev/stoke/internal/proc"
)

// imageDir is where a container finds its image's program: a directory
// on the container's own root (a tmpfs), so it touches nothing of the host.
const imageDir = "/.stoke-nodeagent/image"

// ImageRoot is where a container of an image of Config.Images finds that
// image's files (Image.Root), read-only, on the container's own root.
const ImageRoot = "/.stoke-nodeagent/root"

// killBound bounds the sweep of a container's session after its init is
// gone (the PID namespace's end has killed everything already).
const killBound = 5 * time.Second

// container is one container of a Pod and its current run. Owned by the
// worker's goroutine.
type container struct {
	w    *podWorker
	spec corev1.Container
	init bool // an init container: runs to success, never restarted after

	gen       int // counts starts; events carry it
	proc      *proc.Process
	session   proc.Session
	stopProbe context.CancelFunc
	binary    string
	startedAt metav1.Time

	restartCount   int32
	lastTerm       *corev1.ContainerStateTerminated // the run before this one
	term           *corev1.ContainerStateTerminated // this run's end, until restarted
	waitingReason  string
	waitingMessage string
	nextStart      time.Time
	backoff        time.Duration
	noRestart      bool // the Pod is going away
	swept          bool // this run's session was swept

	started   bool // startup probe passed (or none)
	ready     bool
	successes map[probeKind]int
	failures  map[probeKind]int
}

// shouldRun says whether a container that is not running is to be
// started (again) under the Pod's restartPolicy.
func (c *container) shouldRun(policy corev1.RestartPolicy) bool {
	switch {
	case c.noRestart:
		return false
	case c.term == nil:
		return true
	case c.init:
		// An init container that failed runs again unless the Pod never
		// restarts anything; one that succeeded is done.
		return c.term.ExitCode != 0 && policy != corev1.RestartPolicyNever
	case policy == corev1.RestartPolicyAlways:
		return true
	case policy == corev1.RestartPolicyOnFailure:
		return c.term.ExitCode != 0
	}
	return false
}

// succeeded reports whether the container's last run exited 0 and it
// is not running.
func (c *container) succeeded() bool {
	return c.proc == nil && c.term != nil && c.term.ExitCode == 0
}

// start runs the container: its init, in new mount, PID and UTS
// namespaces and a session of its own, builds its file system and starts
// the command.
func (w *podWorker) start(ctx context.Context, c *container) error {
	pod := w.pod
	// An image is files (Config.Images: bound at ImageRoot, with its ENV)
	// or one binary (Config.Image: its entrypoint, inside the container
	// whatever the Pod mounts over the host's directories, and first on
	// its PATH).
	files, isFiles := w.a.cfg.Images[c.spec.Image]
	var binary, entrypoint, binDir string
	if !isFiles {
		var err error
		if binary, err = w.a.cfg.Image(c.spec.Image); err != nil {
			return err
		}
		entrypoint, binDir = path.Join(imageDir, filepath.Base(binary)), imageDir
	}
	e, err := w.containerEnv(ctx, &c.spec, binDir, files.Env)
	if err != nil {
		return err
	}
	argv := make([]string, 0, len(c.spec.Command)+len(c.spec.Args)+1)
	for _, s := range c.spec.Command {
		argv = append(argv, expand(s, e.get))
	}
	if len(argv) == 0 {
		if entrypoint == "" {
			return fmt.Errorf("image %q has no entrypoint here: give the container a command", c.spec.Image)
		}
		argv = append(argv, entrypoint)
	}
	for _, s := range c.spec.Args {
		argv = append(argv, expand(s, e.get))
	}
	mounts, err := w.mounts(&c.spec)
	if err != nil {
		return err
	}
	if isFiles {
		mounts = append([]mountSpec{{Source: files.Root, Target: ImageRoot, ReadOnly: true}}, mounts...)
	} else {
		mounts = append([]mountSpec{{Source: binary, Target: entrypoint, ReadOnly: true}}, mounts...)
	}
	gen := c.gen + 1
	cdir := filepath.Join(w.dir, "containers", c.spec.Name+"-"+strconv.Itoa(gen))
	if err := os.MkdirAll(filepath.Join(cdir, "root"), 0o700); err != nil {
		return err
	}
	spec := containerinit.Spec{
		Hostname: pod.Name, Root: filepath.Join(cdir, "root"), Mounts: mounts,
		Argv: argv, Env: e.list(), Dir: c.spec.WorkingDir,
		ExecSocket: filepath.Join(w.a.sockets, strconv.FormatInt(w.a.nsock.Add(1), 10)+".sock"),
	}
	logf, err := os.OpenFile(filepath.Join(w.dir, "logs", c.spec.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(w.a.init)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS}
	p, err := proc.Start(cmd, proc.NewSession())
	pr.Close()
	if err != nil {
		pw.Close()
		return fmt.Errorf("start container %s: %w", c.spec.Name, err)
	}
	// The session, with its leader's start time, so that the sweep never
	// reaches a later process that reuses the pid.
	session, err := proc.SessionOf(p.Pid())
	if err == nil {
		err = json.NewEncoder(pw).Encode(spec)
	}
	pw.Close()
	if err != nil {
		p.Kill(0)
		return fmt.Errorf("start container %s: send its spec: %w", c.spec.Name, err)
	}
	if c.term != nil {
		c.restartCount++
		c.lastTerm, c.term = c.term, nil
	}
	c.gen, c.proc, c.session, c.binary, c.swept = gen, p, session, binary, false
	c.startedAt = metav1.NewTime(w.a.clock.Now())
	c.waitingReason, c.waitingMessage = "", ""
	c.ready = false
	c.started = c.spec.StartupProbe == nil
	c.successes, c.failures = map[probeKind]int{}, map[probeKind]int{}
	w.smu.Lock()
	w.sockets[c.spec.Name] = spec.ExecSocket
	w.smu.Unlock()
	pctx, cancel := context.WithCancel(ctx)
	c.stopProbe = cancel
	w.log.Info("container started", "container", c.spec.Name, "restarts", c.restartCount, "pid", p.Pid())
	go func() {
		<-p.Done()
		code := p.ExitCode()
		select {
		case w.events <- event{c: c, gen: gen, exit: &code}:
		case <-w.done:
		}
	}()
	w.startProbes(pctx, c, gen)
	return nil
}

// exited records the end of the container's current run.
func (c *container) exited(code int) {
	w := c.w
	c.sweep()
	c.proc = nil
	c.ready = false
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.term = &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: reason, StartedAt: c.startedAt,
		FinishedAt:  metav1.NewTime(w.a.clock.Now()),
		ContainerID: c.id(),
	}
	if code > 128 && code < 128+65 {
		c.term.Signal = int32(code - 128)
	}
	w.log.Info("container exited", "container", c.spec.Name, "code", code)
	// Back off as the kubelet does: a run that lasted long enough resets it.
	ran := c.term.FinishedAt.Sub(c.startedAt.Time)
	switch {
	case c.backoff == 0 || ran > 2*w.a.cfg.MaxRestartBackoff:
		c.backoff = w.a.cfg.RestartBackoff
	default:
		c.backoff = min(2*c.backoff, w.a.cfg.MaxRestartBackoff)
	}
	c.nextStart = w.a.clock.Now().Add(c.backoff)
}

// sweep ends what is left of a container whose init has exited or is
// being killed: its probes, its exec socket, and (belt and braces: the
// PID namespace ended with its init) its session.
func (c *container) sweep() {
	if c.swept || c.proc == nil {
		return
	}
	c.swept = true
	if c.stopProbe != nil {
		c.stopProbe()
		c.stopProbe = nil
	}
	c.w.smu.Lock()
	if sock, ok := c.w.sockets[c.spec.Name]; ok {
		_ = os.Remove(sock)
		delete(c.w.sockets, c.spec.Name)
	}
	c.w.smu.Unlock()
	if _, err := c.session.Kill(killBound); err != nil {
		c.w.log.Warn("kill container session", "container", c.spec.Name, "err", err)
	}
}

// stop kills the container's current run: SIGTERM to its init, which
// forwards it to the command, then, after grace, SIGKILL to the init,
// which ends its PID namespace and with it everything the container
// started. It returns when the init is gone; the exit event follows.
func (c *container) stop(grace time.Duration) {
	p := c.proc
	if p == nil {
		return
	}
	if grace > 0 {
		_ = syscall.Kill(p.Pid(), syscall.SIGTERM)
		t := c.w.a.clock.NewTimer(grace)
		select {
		case <-p.Done():
		case <-t.C():
		}
		t.Stop()
	}
	p.Kill(0)
	c.sweep()
}

func (c *container) id() string {
	return fmt.Sprintf("stoke-nodeagent://%s-%s-%d", c.w.uid, c.spec.Name, c.gen)
}
