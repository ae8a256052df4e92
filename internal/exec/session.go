package exec

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/proc"
)

// killBound bounds how long killing a session's processes may take.
const killBound = 2 * time.Second

// eot is the terminal's default EOF character (VEOF, ^D): what a closed
// stdin becomes with a TTY, as when a user presses ^D.
const eot = 0x04

// localSession is one command started by Local.
type localSession struct {
	l      *Local
	req    Request
	target Target
	log    *slog.Logger

	// Set by start. p is nil when the command could not be found or
	// executed: then Stream reports missing with exit status missingCode.
	p           *proc.Process
	scope       string       // its proc.ScopeEnv, when Local tracks scopes
	session     proc.Session // the command's session, for a safe kill
	missing     string
	missingCode int
	ptmx        *os.File // the terminal's master side, with a TTY
	stdin       *os.File // the write end of stdin's pipe, without a TTY
	stdout      *os.File // read ends, without a TTY
	stderr      *os.File

	// reaped is closed once the leader exited and the rest of its session
	// was killed.
	reaped chan struct{}

	endOnce sync.Once
	ended   chan struct{} // closed when the session is ended early
	endErr  error         // why; written before ended is closed

	closeOnce sync.Once
}

func (s *localSession) runUID() string { return s.req.RunUID }

// start starts the command as the leader of a new session.
func (s *localSession) start() error {
	s.reaped = make(chan struct{})
	s.ended = make(chan struct{})
	if s.l.cfg.Scopes != nil {
		s.scope = newScope()
	}
	env, path := mergeEnv(s.target.Env, s.req.Env, s.req.TTY, s.scope)
	name, err := proc.LookPath(s.req.Command[0], s.target.Dir, path)
	if err != nil {
		s.setMissing(err)
		close(s.reaped)
		return nil
	}
	cmd := &osexec.Cmd{Path: name, Args: s.req.Command, Dir: s.target.Dir, Env: env}
	var parentEnds []*os.File // the child's ends, closed in the parent once it started
	if s.req.TTY {
		master, tty, err := openPTY(s.req.Size)
		if err != nil {
			return fmt.Errorf("run %s: exec: %w", s.req.RunUID, err)
		}
		s.ptmx = master
		// As login does: the terminal is its user's, so that a program
		// that opens it by name (tty, ssh, sudo) can.
		if err := s.l.cfg.User.GiveFile(tty); err != nil {
			closeFiles(master, tty)
			s.ptmx = nil
			return fmt.Errorf("run %s: exec: terminal: %w", s.req.RunUID, err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		// The command leads a new session (proc.NewSession) whose
		// controlling terminal is the PTY (its fd 0): ^C in the byte
		// stream reaches the terminal's foreground process group.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setctty: true, Ctty: 0}
		parentEnds = append(parentEnds, tty)
	} else {
		if s.req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("run %s: exec: stdin pipe: %w", s.req.RunUID, err)
			}
			cmd.Stdin, s.stdin = r, w
			parentEnds = append(parentEnds, r)
			growPipe(w)
		}
		for _, end := range []**os.File{&s.stdout, &s.stderr} {
			r, w, err := os.Pipe()
			if err != nil {
				s.closeFiles()
				closeFiles(parentEnds...)
				return fmt.Errorf("run %s: exec: output pipe: %w", s.req.RunUID, err)
			}
			*end = r
			parentEnds = append(parentEnds, w)
			growPipe(r)
		}
		cmd.Stdout, cmd.Stderr = parentEnds[len(parentEnds)-2], parentEnds[len(parentEnds)-1]
	}
	if s.scope != "" {
		s.l.cfg.Scopes.Begin(s.scope)
	}
	p, err := proc.Start(cmd, proc.NewSession(), proc.AsUser(s.l.cfg.User.Credential()))
	closeFiles(parentEnds...)
	if err != nil {
		if s.scope != "" {
			s.l.cfg.Scopes.End(s.scope)
		}
		s.closeFiles()
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOEXEC) {
			s.setMissing(fmt.Errorf("%q: %w: %w", s.req.Command[0], proc.ErrNotExecutable, err))
			close(s.reaped)
			return nil
		}
		return fmt.Errorf("run %s: exec: start: %w", s.req.RunUID, err)
	}
	s.p = p
	if sess, err := proc.SessionOf(p.Pid()); err == nil {
		s.session = sess
	} else {
		s.session = proc.Session{ID: p.Pid()} // exited already: nothing of it may be left
	}
	s.log.Info("exec started", "pid", p.Pid(), "command", s.req.Command[0], "tty", s.req.TTY)
	go s.watch()
	return nil
}

// setMissing records a command that cannot run, with the shell's status.
func (s *localSession) setMissing(err error) {
	s.missingCode = 127
	if errors.Is(err, proc.ErrNotExecutable) {
		s.missingCode = 126
	}
	s.missing = "stoke exec: " + err.Error()
}

// watch kills the session's processes once its leader exits (so nothing
// it started outlives it or holds its pipes open), or when the session is
// ended first.
func (s *localSession) watch() {
	defer close(s.reaped)
	select {
	case <-s.p.Done():
	case <-s.target.Ended:
		reason := "its run ended"
		if s.target.Reason != nil {
			reason = s.target.Reason()
		}
		s.end(errdefs.Errorf(errdefs.ErrNotRunning, "run %s: exec session ended: %s", s.req.RunUID, reason))
	case <-s.ended:
	}
	s.kill()
}

// kill kills every process of the session and waits for the leader.
func (s *localSession) kill() {
	if s.p == nil {
		return
	}
	var killed []int
	var err error
	if s.session.Start != 0 {
		killed, err = s.session.Kill(killBound)
	} else {
		killed, err = proc.KillSession(s.session.ID, killBound)
	}
	if err != nil {
		s.log.Warn("killing the exec session", "error", err)
	}
	s.p.Kill(0)
	if len(killed) > 0 {
		s.log.Debug("killed the exec session's processes", "pids", killed)
	}
	if s.scope != "" {
		// What left the session (setsid) and was orphaned goes too.
		s.l.cfg.Scopes.End(s.scope)
	}
}

// newScope names a session's scope: unique and random.
func newScope() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "exec_" + hex.EncodeToString(b[:])
}

// end ends the session early with err: its processes are killed and
// Stream returns err.
func (s *localSession) end(err error) {
	s.endOnce.Do(func() {
		s.endErr = err
		close(s.ended)
		// Unblocks pumps waiting to read; a pump blocked writing to the
		// caller is unblocked by the caller's own end.
		s.closeFiles()
	})
}

func (s *localSession) Stream(ctx context.Context, st Streams) (Exit, error) {
	if s.p == nil {
		w := st.Stderr
		msg := s.missing + "\n"
		if s.req.TTY || w == nil {
			w, msg = st.Stdout, s.missing+"\r\n"
		}
		if w != nil {
			_, _ = io.WriteString(w, msg)
		}
		return Exit{Code: s.missingCode}, nil
	}
	var wg sync.WaitGroup
	out := s.stdout
	if s.req.TTY {
		out = s.ptmx
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		pump(st.Stdout, out)
	}()
	if s.stderr != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(st.Stderr, s.stderr)
		}()
	}
	if st.Stdin != nil && s.req.Stdin {
		in := s.stdin
		if s.req.TTY {
			in = s.ptmx
		}
		go s.copyStdin(in, st.Stdin)
	}
	drained := make(chan struct{})
	go func() {
		wg.Wait()
		close(drained)
	}()
	select {
	case <-drained:
		// All output is written; the command may still run (it closed
		// its output), so its exit is awaited.
		select {
		case <-s.reaped:
		case <-s.ended:
		case <-ctx.Done():
			s.end(fmt.Errorf("run %s: exec session: %w", s.req.RunUID, ctx.Err()))
		}
	case <-s.ended:
	case <-ctx.Done():
		s.end(fmt.Errorf("run %s: exec session: %w", s.req.RunUID, ctx.Err()))
	}
	select {
	case <-s.ended:
		<-s.reaped
		return Exit{}, s.endErr
	default:
	}
	<-s.reaped
	<-drained
	sig := s.p.ExitSignal()
	code := s.p.ExitCode()
	s.log.Info("exec finished", "exit_code", code)
	return Exit{Code: code, Signal: int(sig)}, nil
}

// pump copies r to w in frames of at most bounds.ExecFrame until r ends
// (EOF, or EIO from a terminal whose other side is closed) or w fails, so
// that a w that blocks holds back the command on its pipe.
func pump(w io.Writer, r *os.File) {
	buf := make([]byte, bounds.ExecFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// copyStdin copies the caller's stdin to the command; its EOF closes the
// command's stdin (with a TTY, sends ^D).
func (s *localSession) copyStdin(w *os.File, r io.Reader) {
	buf := make([]byte, bounds.ExecFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if s.req.TTY {
					_, _ = w.Write([]byte{eot})
				} else {
					_ = w.Close()
				}
			}
			return
		}
	}
}

func (s *localSession) Pid() int {
	if s.p == nil {
		return 0
	}
	return s.p.Pid()
}

func (s *localSession) Resize(size TermSize) error {
	if s.ptmx == nil {
		return nil
	}
	return setSize(s.ptmx, size)
}

func (s *localSession) Signal(sig syscall.Signal) error {
	if s.p == nil {
		return nil
	}
	pgid := s.p.Pid()
	if s.ptmx != nil {
		if fg, err := foreground(s.ptmx); err == nil && fg > 1 {
			pgid = fg
		}
	}
	// The group must be this session's: a stale foreground group could be
	// another's once reused.
	if sid, err := unix.Getsid(pgid); err != nil || sid != s.session.ID {
		return nil
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("run %s: exec: signal: %w", s.req.RunUID, err)
	}
	return nil
}

func (s *localSession) Close() error {
	s.closeOnce.Do(func() {
		s.end(errdefs.Errorf(errdefs.ErrCanceled, "run %s: exec session closed", s.req.RunUID))
		<-s.reaped
		s.l.release(s)
	})
	return nil
}

func (s *localSession) closeFiles() {
	closeFiles(s.ptmx, s.stdin, s.stdout, s.stderr)
}

func closeFiles(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// mergeEnv overlays extra on the Run's environment (a later entry wins, as
// in execve's callers) and returns it with the PATH to resolve the command
// in. $STOKE_OUTPUTS is left out: an exec never sets the Run's outputs.
// scope, when not empty, is the session's own proc.ScopeEnv. A TTY gets
// TERM=xterm unless one is set.
func mergeEnv(base []string, extra map[string]string, tty bool, scope string) ([]string, string) {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	for k, v := range extra {
		set(k, v)
	}
	if _, ok := vals["TERM"]; tty && !ok {
		set("TERM", "xterm")
	}
	delete(vals, "STOKE_OUTPUTS")
	delete(vals, proc.ScopeEnv)
	if scope != "" {
		set(proc.ScopeEnv, scope)
	}
	env := make([]string, 0, len(vals))
	for _, k := range order {
		if v, ok := vals[k]; ok {
			env = append(env, k+"="+v)
		}
	}
	return env, vals["PATH"]
}

// growPipe makes a pipe hold a whole frame (bounds.ExecFrame; Linux's
// default is 64 KiB), so that the command and the pump move a frame per
// system call and per wake-up. It is best effort: past the user's pipe
// allowance (fs.pipe-user-pages-soft) the kernel refuses, and the pipe
// keeps its size.
func growPipe(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, bounds.ExecFrame)
	})
}

// OpenPTY opens a terminal of the given size (zero: 80×24), as exec
// sessions do, for a task run on one: the master is non-blocking and
// pollable, so that closing it unblocks a pending Read.
func OpenPTY(size TermSize) (master, tty *os.File, err error) { return openPTY(size) }

// openPTY opens a terminal of the given size. The master is made
// non-blocking and pollable, so that closing it unblocks a pending Read
// (pty.Open leaves it in blocking mode).
func openPTY(size TermSize) (master, tty *os.File, err error) {
	m, t, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	fd, err := unix.Dup(int(m.Fd()))
	_ = m.Close()
	if err != nil {
		_ = t.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		_ = t.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if size.Width == 0 || size.Height == 0 {
		size = TermSize{Width: 80, Height: 24}
	}
	if err := setSize(master, size); err != nil {
		_ = master.Close()
		_ = t.Close()
		return nil, nil, err
	}
	return master, t, nil
}

// setSize applies the window-size ioctl; the kernel sends SIGWINCH to the
// terminal's foreground group.
func setSize(f *os.File, size TermSize) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Height, Col: size.Width})
	}); err != nil {
		return err
	}
	if ierr != nil {
		return fmt.Errorf("resize terminal: %w", ierr)
	}
	return nil
}

// foreground returns the terminal's foreground process group.
func foreground(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var pgrp int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		pgrp, ierr = unix.IoctlGetInt(int(fd), unix.TIOCGPGRP)
	}); err != nil {
		return 0, err
	}
	return pgrp, ierr
}
