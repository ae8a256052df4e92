// Package proc owns child processes for Stoke: each child runs in its own
// process group, its exit is observed by one waiter started with it (so an
// early exit is never missed), and one helper kills the whole group, politely
// first and forcibly after a bound. Every caller that starts user code uses it.
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

// Start starts cmd as the leader of a new process group and begins waiting
// for it. Callers observe the exit through Done, never by calling cmd.Wait.
func Start(cmd *exec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	// If Stoke itself dies, the kernel kills the direct child; the group's
	// other members are reaped by the group kill on the next start-up.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID, which is also the process group ID.
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
