package proc

import (
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ChildScanner lists the children of one long-lived process after every
// call it serves (a Python worker), as Children and KillChildrenExcept do,
// from two /proc files it keeps open: the process's task directory and its
// main thread's children. The directory's link count is two plus the
// number of threads (Linux's proc_task_getattr), so while the process has
// one thread, which is all of a worker waiting for its next call, an
// fstat and two reads list its children, with no path lookup and no stat
// line to make, against Children's open, getdents and close of the task
// directory and of each thread's children file. With more threads it
// lists them all as Children does. The files name the process they were
// opened for, never a later one that reused its pid. The process's main
// thread must be the one that serves the calls, as a worker's does: with
// one thread left, that is the one whose children are read.
type ChildScanner struct {
	pid int

	mu       sync.Mutex
	task     int // fd of /proc/PID/task; -1 once closed
	children int // fd of /proc/PID/task/PID/children
	buf      []byte
}

// NewChildScanner opens pid's files; pid must be a live child of this
// process, so that it cannot have been reused.
func NewChildScanner(pid int) (*ChildScanner, error) {
	base := "/proc/" + strconv.Itoa(pid) + "/task"
	task, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	children, err := unix.Open(base+"/"+strconv.Itoa(pid)+"/children", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(task)
		return nil, err
	}
	return &ChildScanner{pid: pid, task: task, children: children, buf: make([]byte, 0, 512)}, nil
}

// Children returns the live children of the process, those of any of its
// threads; none once the scanner is closed or the process has ended.
func (s *ChildScanner) Children() []Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task < 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.task, &st); err != nil {
		return nil
	}
	if st.Nlink != 2+1 {
		// Other threads may have children of their own (or a kernel
		// that does not count threads in the link count says 2).
		return Children(s.pid)
	}
	// The one thread is the main one: it runs the calls, and this runs
	// after one returned. A read from offset 0 makes the file anew.
	b, err := preadAll(s.children, s.buf[:0])
	s.buf = b[:0]
	if err != nil {
		return nil
	}
	return appendLiveChildren(nil, s.pid, b)
}

// KillExcept is KillChildrenExcept of the scanner's process.
func (s *ChildScanner) KillExcept(keep []Child) []Child {
	return killChildrenExcept(s.pid, keep, s.Children)
}

// Close closes the files; Children then returns none. Safe to call twice.
func (s *ChildScanner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task < 0 {
		return nil
	}
	err1, err2 := unix.Close(s.task), unix.Close(s.children)
	s.task, s.children = -1, -1
	if err1 != nil {
		return err1
	}
	return err2
}

// preadAll reads the /proc file fd from offset 0 to its end into buf,
// growing it as needed. The file must be a seq_file, as /proc's
// children files are: a read of one fills the buffer unless the file
// ends first or the kernel's own buffer (a page at least) is full, so a
// read of at most seqPage bytes that returns fewer is at the end, and
// needs no second read to find that out (the Subreaper's read after
// every call, of a list that holds the pod's spare worker).
func preadAll(fd int, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		want := cap(buf) - len(buf)
		n, err := pread(fd, buf[len(buf):cap(buf)], int64(len(buf)))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return buf, err
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if n < want && want <= seqPage {
			return buf, nil
		}
	}
}

// seqPage is the smallest buffer a seq_file fills a read from: a page.
const seqPage = 4096

// pread is unix.Pread, which a test counts.
var pread = unix.Pread
