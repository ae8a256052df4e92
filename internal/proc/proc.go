// Package proc owns child processes for Stoke: each child runs in its own
// process group (or, for a runtime pod, its own session), its exit is
// observed by one waiter started with it (so an early exit is never
// missed), one helper kills the whole group, politely first and forcibly
// after a bound, and one kills a whole session. Every caller that starts
// user code uses it. A Subreaper collects and kills the orphans that
// escape all of that (setsid, double forks, daemons).
package proc

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is a started child that leads its own process group.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit error from Wait; valid after done is closed

	killOnce sync.Once
}

// An Option changes how Start starts a process.
type Option func(*options)

type options struct {
	session  bool
	deathSig syscall.Signal
	cgroupFD int // -1: the parent's cgroup
	cred     *syscall.Credential
}

// AsUser starts the process with cred's user and group IDs and groups
// (an empty Groups drops the supplementary groups): a Run's process when
// the server is root (internal/runuser). nil starts it as this process.
// Only the child changes its user; this process keeps its own, and with
// it the right to signal, reap and contain the child.
func AsUser(cred *syscall.Credential) Option { return func(o *options) { o.cred = cred } }

// InCgroup starts the process directly in the cgroup v2 whose directory fd
// is open (clone3 with CLONE_INTO_CGROUP), so that it is never outside it,
// not even between fork and exec.
func InCgroup(fd int) Option { return func(o *options) { o.cgroupFD = fd } }

// NewSession starts the process as the leader of a new session (setsid)
// rather than of a new process group in the caller's session. Everything
// it starts stays in that session — in process groups of their own, and
// after being orphaned, too — unless it calls setsid itself, so
// KillSession reaches all of it, even once the leader is gone. A runtime
// pod's Runtime Server is started so.
func NewSession() Option { return func(o *options) { o.session = true } }

// ParentDeathSignal makes the kernel send sig to the process when its
// parent dies, instead of SIGKILL: for a child that cleans up after itself
// on that signal (a Runtime Server kills its process groups on SIGTERM).
func ParentDeathSignal(sig syscall.Signal) Option {
	return func(o *options) { o.deathSig = sig }
}

// Start starts cmd as the leader of a new process group and begins waiting
// for it. Callers observe the exit through Done, never by calling cmd.Wait.
//
// If Stoke itself dies, the kernel sends the child SIGKILL (or the
// ParentDeathSignal); the group's other members are left to the group or
// session kill. The kernel sends it when the *thread* that started the
// child ends (go.dev/issue/27505), not only when the process does. The Go
// runtime ends a thread only when a goroutine locked to it exits, so a
// thread can end under a child only if some other goroutine locks it and
// exits; a caller whose child must not get the signal while Stoke lives
// calls runtime.LockOSThread before Start and unlocks only once the child
// is gone, which keeps every other goroutine off that thread. A parent
// that dies before the child's prctl is not missed: after the prctl the
// child compares its parent with the pid recorded before the fork and
// signals itself if they differ (syscall's forkAndExecInChild).
func Start(cmd *exec.Cmd, opts ...Option) (*Process, error) {
	o := options{deathSig: syscall.SIGKILL, cgroupFD: -1}
	for _, opt := range opts {
		opt(&o)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if o.session {
		// A session leader also leads a new group; setpgid after setsid
		// would fail (EPERM), so it is one or the other.
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setpgid = false
	} else {
		cmd.SysProcAttr.Setpgid = true
	}
	cmd.SysProcAttr.Pdeathsig = o.deathSig
	if o.cred != nil {
		cmd.SysProcAttr.Credential = o.cred
	}
	if o.cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = o.cgroupFD
	}
	// Recorded before a Subreaper can see it (see tracked).
	startMu.RLock()
	err := cmd.Start()
	if err == nil {
		track(cmd.Process.Pid)
	}
	startMu.RUnlock()
	if err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		untrack(cmd.Process.Pid)
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID, which is also the process group ID (and, with
// NewSession, the session ID).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and its pipes are drained.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit error (nil for status 0). Only valid after Done.
func (p *Process) Err() error { return p.err }

// ExitCode returns the exit status, or 128+signal for a signalled process,
// the shell convention. Only valid after Done.
func (p *Process) ExitCode() int { return ExitCode(p.cmd.ProcessState) }

// ExitCode converts a process state into a shell-style exit code.
func ExitCode(ps interface{ Sys() any }) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
	return -1
}

// Kill stops the whole process group: SIGTERM, then SIGKILL after grace (at
// once when grace is zero). It returns when the leader has exited. Safe to
// call more than once and after the process has exited.
func (p *Process) Kill(grace time.Duration) {
	p.killOnce.Do(func() { KillGroup(p.Pid(), grace, p.done) })
	<-p.done
}

// KillGroup signals process group pgid with SIGTERM and, unless exited is
// closed within grace, with SIGKILL. With grace zero it sends SIGKILL at once.
// The group is always sent a final SIGKILL so that members which outlive the
// leader (background jobs) are gone too.
func KillGroup(pgid int, grace time.Duration, exited <-chan struct{}) {
	if pgid <= 1 {
		return // never signal init or our own group by accident
	}
	if grace > 0 {
		if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && errors.Is(err, syscall.ESRCH) {
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}
