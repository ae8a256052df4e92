package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Attachment is a task's own process as attach sessions (Request.Attach)
// join it: its stdin (a pipe, or the terminal's master side), its
// terminal, and its output, which the task's output pumps write through
// Output as they read it. What the task writes before the first session
// joins is held, the last bounds.AttachReplay bytes per stream, and given
// to that session; later sessions see the output from when they join.
//
// A session's writes are made by the pump itself: a slow session holds
// back the task's output (it blocks on its pipe, as under Docker), and
// nothing is dropped.
type Attachment struct {
	tty   bool
	pid   int
	stdin *os.File // the pipe's write end, or the terminal's master

	stdinMu     sync.Mutex // one write to the task's stdin at a time
	stdinClosed bool

	// wmu[i] is held while stream i's output is written to the sessions,
	// so that a session that leaves sees no write after it left.
	wmu [2]sync.Mutex

	mu     sync.Mutex
	early  [2]tailRing
	joined bool
	subs   map[*attachSession]struct{}
	done   chan struct{}
	exit   Exit
}

// NewAttachment returns the Attachment of a task whose process pid reads
// stdin: the pipe's write end, or with tty the terminal's master (also
// what Resize sets). The caller keeps stdin open until Finish.
func NewAttachment(pid int, stdin *os.File, tty bool) *Attachment {
	a := &Attachment{tty: tty, pid: pid, stdin: stdin, subs: map[*attachSession]struct{}{}, done: make(chan struct{})}
	for i := range a.early {
		a.early[i].max = bounds.AttachReplay
	}
	return a
}

// Output returns the writer of the task's stdout (1) or stderr (2), for
// its output pump. Its writes never fail: a session whose write fails
// leaves.
func (a *Attachment) Output(fd int) io.Writer {
	return attachOutput{a: a, i: min(max(fd-1, 0), 1)}
}

type attachOutput struct {
	a *Attachment
	i int
}

func (o attachOutput) Write(p []byte) (int, error) {
	a := o.a
	a.wmu[o.i].Lock()
	defer a.wmu[o.i].Unlock()
	a.mu.Lock()
	if !a.joined {
		a.early[o.i].write(p)
	}
	subs := make([]*attachSession, 0, len(a.subs))
	for s := range a.subs {
		subs = append(subs, s)
	}
	a.mu.Unlock()
	for _, s := range subs {
		if err := s.write(o.i, p); err != nil {
			s.detach(err)
		}
	}
	return len(p), nil
}

// Finish records the task's exit once all its output went through
// Output: the sessions' Streams return it.
func (a *Attachment) Finish(exit Exit) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.done:
		return
	default:
	}
	a.exit = exit
	close(a.done)
}

// join adds s, giving it what was held for the first session.
func (a *Attachment) join(s *attachSession) (early [2][]byte) {
	a.wmu[0].Lock()
	defer a.wmu[0].Unlock()
	a.wmu[1].Lock()
	defer a.wmu[1].Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.joined {
		a.joined = true
		for i := range a.early {
			early[i] = a.early[i].bytes()
			a.early[i] = tailRing{}
		}
	}
	a.subs[s] = struct{}{}
	return early
}

// leave removes s; once it returns, s is written to no more.
func (a *Attachment) leave(s *attachSession) {
	a.wmu[0].Lock()
	defer a.wmu[0].Unlock()
	a.wmu[1].Lock()
	defer a.wmu[1].Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.subs, s)
}

// writeStdin writes p to the task's stdin; it blocks while the task does
// not read (backpressure).
func (a *Attachment) writeStdin(p []byte) error {
	a.stdinMu.Lock()
	defer a.stdinMu.Unlock()
	if a.stdinClosed {
		return os.ErrClosed
	}
	_, err := a.stdin.Write(p)
	return err
}

// closeStdin is stdin's EOF for a StdinOnce session: the pipe is closed,
// a terminal gets its EOF character.
func (a *Attachment) closeStdin() {
	a.stdinMu.Lock()
	defer a.stdinMu.Unlock()
	if a.stdinClosed {
		return
	}
	if a.tty {
		_, _ = a.stdin.Write([]byte{eot})
		return
	}
	a.stdinClosed = true
	_ = a.stdin.Close()
}

// attachSession is one session attached to a task's Attachment.
type attachSession struct {
	l      *Local
	req    Request
	a      *Attachment
	target Target

	out [2]io.Writer // set by Stream before join

	endOnce sync.Once
	ended   chan struct{}
	endErr  error

	closeOnce sync.Once
}

// startAttach joins req's task; target.Attach must be set.
func (l *Local) startAttach(req Request, target Target) (Session, error) {
	if target.Attach == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "run %s: attach: its task was started without stdin or a terminal", req.RunUID)
	}
	req.TTY = target.Attach.tty
	s := &attachSession{l: l, req: req, a: target.Attach, target: target, ended: make(chan struct{})}
	if err := l.acquire(s); err != nil {
		return nil, err
	}
	// A size given at the start is applied before Start returns, so that
	// a session that only resizes (`docker container resize`) may end at
	// once.
	if err := s.Resize(req.Size); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func (s *attachSession) runUID() string { return s.req.RunUID }

func (s *attachSession) write(i int, p []byte) error {
	w := s.out[i]
	if w == nil {
		return nil
	}
	_, err := w.Write(p)
	return err
}

// detach ends the session because writing its output failed.
func (s *attachSession) detach(err error) {
	s.end(fmt.Errorf("run %s: attach: writing output: %w", s.req.RunUID, err))
}

func (s *attachSession) end(err error) {
	s.endOnce.Do(func() {
		s.endErr = err
		close(s.ended)
	})
}

func (s *attachSession) Stream(ctx context.Context, st Streams) (Exit, error) {
	s.out = [2]io.Writer{st.Stdout, st.Stderr}
	if s.a.tty {
		s.out[1] = nil
	}
	var early [2][]byte
	if !s.req.ControlOnly {
		early = s.a.join(s)
		defer s.a.leave(s)
	}
	for i, b := range early {
		if len(b) > 0 {
			if err := s.write(i, b); err != nil {
				return Exit{}, fmt.Errorf("run %s: attach: writing output: %w", s.req.RunUID, err)
			}
		}
	}
	if st.Stdin != nil && s.req.Stdin {
		go s.copyStdin(st.Stdin)
	}
	select {
	case <-s.a.done:
		// Finish comes after the last output: every write was made.
		return s.a.exit, nil
	case <-s.target.Ended:
		select {
		case <-s.a.done:
			return s.a.exit, nil
		default:
		}
		reason := "its run ended"
		if s.target.Reason != nil {
			reason = s.target.Reason()
		}
		return Exit{}, errdefs.Errorf(errdefs.ErrNotRunning, "run %s: attach session ended: %s", s.req.RunUID, reason)
	case <-s.ended:
		return Exit{}, s.endErr
	case <-ctx.Done():
		return Exit{}, fmt.Errorf("run %s: attach session: %w", s.req.RunUID, ctx.Err())
	}
}

// copyStdin copies the caller's stdin to the task's until EOF (which, with
// StdinOnce, closes it), an error, or the session's end.
func (s *attachSession) copyStdin(r io.Reader) {
	buf := make([]byte, bounds.ExecFrame)
	for {
		n, err := r.Read(buf)
		select {
		case <-s.ended:
			return
		default:
		}
		if n > 0 {
			if werr := s.a.writeStdin(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && s.req.StdinOnce {
				s.a.closeStdin()
			}
			return
		}
	}
}

func (s *attachSession) Pid() int { return s.a.pid }

func (s *attachSession) Resize(size TermSize) error {
	if !s.a.tty || size.Width == 0 || size.Height == 0 {
		return nil
	}
	select {
	case <-s.a.done:
		return nil
	default:
	}
	if err := setSize(s.a.stdin, size); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("run %s: attach: %w", s.req.RunUID, err)
	}
	return nil
}

func (s *attachSession) Signal(sig syscall.Signal) error {
	select {
	case <-s.a.done:
		return nil
	default:
	}
	if err := syscall.Kill(-s.a.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("run %s: attach: signal: %w", s.req.RunUID, err)
	}
	return nil
}

func (s *attachSession) Close() error {
	s.closeOnce.Do(func() {
		s.end(errdefs.Errorf(errdefs.ErrCanceled, "run %s: attach session closed", s.req.RunUID))
		s.l.release(s)
	})
	return nil
}

// tailRing keeps the last max bytes written to it.
type tailRing struct {
	max int
	buf []byte
}

func (r *tailRing) write(p []byte) {
	if r.max <= 0 {
		return
	}
	if len(p) >= r.max {
		r.buf = append(r.buf[:0], p[len(p)-r.max:]...)
		return
	}
	if over := len(r.buf) + len(p) - r.max; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	r.buf = append(r.buf, p...)
}

func (r *tailRing) bytes() []byte { return r.buf }
