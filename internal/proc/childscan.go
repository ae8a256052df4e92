package proc

import (
	"bytes"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ChildScanner lists the children of one long-lived process after every
// call it serves (a Python worker), as Children and KillChildrenExcept do,
// from two /proc files it keeps open: the process's stat and its main
// thread's children. While the process has one thread, which is all of a
// worker waiting for its next call, that is three reads and no path
// lookup, against Children's open, getdents and close of the task
// directory and of each thread's children file. With more threads, or a
// main thread that has ended, it lists them all as Children does. The
// files name the process they were opened for, never a later one that
// reused its pid.
type ChildScanner struct {
	pid int

	mu       sync.Mutex
	stat     int // fd of /proc/PID/stat; -1 once closed
	children int // fd of /proc/PID/task/PID/children
	buf      []byte
}

// NewChildScanner opens pid's files; pid must be a live child of this
// process, so that it cannot have been reused.
func NewChildScanner(pid int) (*ChildScanner, error) {
	base := "/proc/" + strconv.Itoa(pid)
	stat, err := unix.Open(base+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	children, err := unix.Open(base+"/task/"+strconv.Itoa(pid)+"/children", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(stat)
		return nil, err
	}
	return &ChildScanner{pid: pid, stat: stat, children: children, buf: make([]byte, 0, 4096)}, nil
}

// Children returns the live children of the process, those of any of its
// threads; none once the scanner is closed.
func (s *ChildScanner) Children() []Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stat < 0 {
		return nil
	}
	// /proc/PID/stat is one line, which one read returns whole (a
	// seq_file gives a record whole when the buffer holds it); a read
	// from offset 0 makes a seq_file anew.
	b := s.buf[:cap(s.buf)]
	n, err := unix.Pread(s.stat, b, 0)
	if err != nil || n == len(b) {
		return nil // gone (ESRCH), or not a stat line
	}
	st, err := parseStat(b[:n])
	if err != nil {
		return nil
	}
	if st.threads != 1 || !st.live() {
		// Other threads may have children of their own, and a main
		// thread that has ended has none.
		return Children(s.pid)
	}
	b, err = preadAll(s.children, s.buf[:0])
	s.buf = b[:0]
	if err != nil {
		return nil
	}
	var kids []Child
	for f := range bytes.FieldsSeq(b) {
		child, err := strconv.Atoi(string(f))
		if err != nil {
			continue
		}
		if st, err := readStat(child); err == nil && st.live() && st.ppid == s.pid {
			kids = append(kids, Child{Pid: child, start: st.start})
		}
	}
	return kids
}

// KillExcept is KillChildrenExcept of the scanner's process.
func (s *ChildScanner) KillExcept(keep []Child) []Child {
	return killChildrenExcept(s.pid, keep, s.Children)
}

// Close closes the files; Children then returns none. Safe to call twice.
func (s *ChildScanner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stat < 0 {
		return nil
	}
	err1, err2 := unix.Close(s.stat), unix.Close(s.children)
	s.stat, s.children = -1, -1
	if err1 != nil {
		return err1
	}
	return err2
}

// preadAll reads the file fd from offset 0 to its end into buf, growing
// it as needed.
func preadAll(fd int, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(fd, buf[len(buf):cap(buf)], int64(len(buf)))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return buf, err
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}
