package proc

import (
	"bytes"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// SpawnWatch tells, in one small read, whether any process or thread may
// have been created in this process's pid namespace since a caller last
// looked, so that the looks a Runtime Server makes after every call (the
// worker's children, the orphans: ChildScanner, Subreaper.End) can be
// skipped when nothing was started. It reads the last field of
// /proc/loadavg: the pid the namespace allocated last, which every fork,
// clone and new thread in the namespace, or in one nested in it, moves on.
// It names no process, so it is only ever a reason to skip a look, never
// a substitute for one: a caller that sees it move looks as before.
//
// The field is a cursor over the pids, not a count: it comes back to the
// same value only after pid_max creations, a full wrap of the pid space,
// in between two looks. A handler that does that within one call leaves
// what it started to the looks that do not depend on this one (the
// Subreaper's periodic scan, the end of the Run, which kills everything
// the Run started).
type SpawnWatch struct {
	// look returns the cursor, or -1 when it cannot be read (every look
	// is then made).
	look func() int
}

// Unchanged reports whether the cursor still has the value *mark holds:
// nothing was created since *mark was set. When it has moved (or cannot
// be read) it sets *mark to the value it read, before the caller's look,
// so that whatever is created during or after that look moves it again.
// A mark starts at -1, which no cursor equals.
func (w *SpawnWatch) Unchanged(mark *int) bool {
	cur := w.look()
	if cur >= 0 && cur == *mark {
		return true
	}
	*mark = cur
	return false
}

// spawns is this process's SpawnWatch, over /proc/loadavg kept open.
var spawns = &SpawnWatch{look: (&loadavg{fd: -1}).lastPid}

// loadavg reads /proc/loadavg from a descriptor kept open: a read from
// offset 0 is one system call where an open by path is a lookup in /proc,
// a read and a close besides.
type loadavg struct {
	mu     sync.Mutex
	fd     int // -1: not open yet
	failed bool
	buf    [128]byte // the file is "0.00 0.00 0.00 1/100 12345\n"
}

func (l *loadavg) lastPid() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed {
		return -1
	}
	if l.fd < 0 {
		fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			l.failed = true
			return -1
		}
		l.fd = fd
	}
	var n int
	var err error
	for {
		if n, err = unix.Pread(l.fd, l.buf[:], 0); err != unix.EINTR {
			break
		}
	}
	if err != nil || n == 0 || n == len(l.buf) {
		return -1
	}
	return parseLastPid(l.buf[:n])
}

// parseLastPid is the last field of a /proc/loadavg line, -1 if it is
// not a pid.
func parseLastPid(b []byte) int {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, ' '); i >= 0 {
		b = b[i+1:]
	}
	pid, err := strconv.Atoi(string(b)) // does not allocate: the conversion stays on the stack
	if err != nil || pid < 0 {
		return -1
	}
	return pid
}
