package python

import (
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/loglines"
	"stoke.dev/stoke/internal/runtime"
)

// maxSettleRounds bounds how many chunks attribute waits for: a worker that
// writes without pause (a background thread) must not hold an invocation
// back. 64 chunks of loglines' 32 KiB are more than a pipe buffer holds.
const maxSettleRounds = 64

// logStream files one of the worker's output pipes (stdout or stderr) in
// the Run's output line by line and knows whose the bytes are: each chunk
// is read from the pipe and its lines filed while mu is held, under the
// invocation that owns the stream at that moment, so that attribute can
// tell exactly which bytes are still unread when an invocation starts or
// ends. A line is filed when it is complete (or reaches bounds.LogLine), so
// the unfinished end of an invocation's output (print(..., end="")) goes
// to whoever owns the stream when the line completes, or to the
// registration (no invocation) at EOF.
type logStream struct {
	name string
	f    *os.File
	rc   syscall.RawConn
	out  runtime.Output

	mu    sync.Mutex
	moved sync.Cond // broadcast after each chunk is filed, and at EOF
	owner string    // invocation ID of the bytes read from now on; "" none
	ended bool      // the pump returned

	held bool // pump goroutine only: Read returned with mu held

	// inq is unread's FIONREAD result and fionread the function that
	// reads it, made once: a closure made per call, over variables of
	// the call, would take two allocations four times an invocation.
	inq      int32
	inqErr   syscall.Errno
	fionread func(fd uintptr)
}

func newLogStream(name string, f *os.File, out runtime.Output) (*logStream, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &logStream{name: name, f: f, rc: rc, out: out}
	s.moved.L = &s.mu
	s.fionread = func(fd uintptr) {
		_, _, s.inqErr = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&s.inq)))
	}
	return s, nil
}

// pump files the stream until EOF or until Close's drain deadline; it is
// run by one goroutine of the instance.
func (s *logStream) pump() {
	loglines.Pump(s, s.emit)
	if !s.held {
		s.mu.Lock()
	}
	s.held = false
	s.ended = true
	s.moved.Broadcast()
	s.mu.Unlock()
}

// emit files one line; Pump calls it between two Reads, so mu is held.
func (s *logStream) emit(line []byte) {
	s.out.Line(s.name, s.owner, line)
}

// Read implements io.Reader for loglines.Pump. It returns with mu held
// (released by the next Read, or by pump at the end), and takes mu before
// the read system call, so that no byte is ever between the pipe and the
// Output without mu held. It flushes the Output first: the lines filed so
// far are all there is until this read returns.
func (s *logStream) Read(p []byte) (int, error) {
	if s.held {
		s.held = false
		s.moved.Broadcast()
		s.mu.Unlock()
	}
	s.out.Flush()
	var n int
	var rerr error
	err := s.rc.Read(func(fd uintptr) bool {
		s.mu.Lock()
		for {
			n, rerr = syscall.Read(int(fd), p)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			s.mu.Unlock()
			return false // wait until readable
		}
		return true
	})
	if err != nil { // closed or past the drain deadline; mu is not held
		s.mu.Lock()
		s.held = true
		return 0, err
	}
	s.held = true
	switch {
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// attribute waits (boundedly) until what the pipe holds now has been filed
// under the current owner, then makes invocation id ("" for none) the
// owner of what follows.
func (s *logStream) attribute(id string) {
	s.mu.Lock()
	for round := 0; round < maxSettleRounds && !s.ended && s.unread(); round++ {
		s.moved.Wait()
	}
	s.owner = id
	s.mu.Unlock()
}

// unread reports whether the pipe holds bytes not yet read (FIONREAD);
// mu must be held.
func (s *logStream) unread() bool {
	s.inq, s.inqErr = 0, 0
	err := s.rc.Control(s.fionread)
	return err == nil && s.inqErr == 0 && s.inq > 0
}

// logStreams are the worker's two output pipes, attributed together: at
// each end of an invocation one poll(2) of both pipes tells whether
// either holds unread bytes, where a FIONREAD of each took two system
// calls (four a call, on the warm invoke's path: docs/benchmarks.md).
// Only when one may (or the poll fails) does each stream wait as
// attribute does.
type logStreams struct {
	stdout, stderr *logStream

	// fds, n and err are pollBoth's, and outer and inner its closures,
	// made once: a closure made per call would allocate.
	fds          [2]unix.PollFd
	n            int
	err          error
	outer, inner func(fd uintptr)
}

func newLogStreams(stdout, stderr *logStream) *logStreams {
	p := &logStreams{stdout: stdout, stderr: stderr}
	p.inner = func(fd uintptr) {
		p.fds[1] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		for {
			p.n, p.err = unix.Poll(p.fds[:], 0)
			if p.err != unix.EINTR {
				return
			}
		}
	}
	p.outer = func(fd uintptr) {
		p.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		if err := p.stderr.rc.Control(p.inner); err != nil {
			p.err = err
		}
	}
	return p
}

// attribute is stdout.attribute(id) then stderr.attribute(id). With both
// mutexes held and neither pipe readable, nothing is unread in either
// (what a pump read is filed before it lets go of its mutex), so both
// owners change at once, as the two attribute calls would have changed
// them one after the other with nothing to wait for.
func (p *logStreams) attribute(id string) {
	a, b := p.stdout, p.stderr
	a.mu.Lock()
	b.mu.Lock()
	quiet := !a.ended && !b.ended && !p.pollBoth()
	if quiet {
		a.owner, b.owner = id, id
	}
	b.mu.Unlock()
	a.mu.Unlock()
	if !quiet {
		a.attribute(id)
		b.attribute(id)
	}
}

// pollBoth reports whether either pipe may hold unread bytes: true
// unless poll(2) found neither readable (a closed write end reads as
// readable too, and goes the slow way). Both mutexes are held.
func (p *logStreams) pollBoth() bool {
	p.n, p.err = 0, nil
	p.fds = [2]unix.PollFd{}
	if err := p.stdout.rc.Control(p.outer); err != nil {
		return true
	}
	return p.err != nil || p.n != 0 || p.fds[0].Revents != 0 || p.fds[1].Revents != 0
}
