package python

import (
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"

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
