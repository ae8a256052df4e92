package proc

import (
	"bytes"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// Child names a child process by its pid and its start time, so that a
// process that reused the pid of an earlier one is told apart from it.
type Child struct {
	Pid   int
	start uint64 // clock ticks after boot
}

// Children returns the live (not zombie) children of pid, those of any of
// its threads.
func Children(pid int) []Child {
	// Run after every Python invocation: raw system calls into one
	// buffer, as os.Open would also stat each file and try to register it
	// with the poller, which costs more here than the reads.
	var stack [4096]byte
	base := "/proc/" + strconv.Itoa(pid) + "/task/"
	tids, err := readProc(base, stack[:0], true)
	if err != nil {
		return nil
	}
	var kids []Child
	for t := range bytes.FieldsSeq(tids) {
		b, err := readProc(base+string(t)+"/children", nil, false)
		if err != nil {
			continue
		}
		kids = appendLiveChildren(kids, pid, b)
	}
	return kids
}

// appendLiveChildren appends to kids those of the pids of the children
// file b that are live children of parent.
func appendLiveChildren(kids []Child, parent int, b []byte) []Child {
	for f := range bytes.FieldsSeq(b) {
		child, err := strconv.Atoi(string(f))
		if err != nil {
			continue
		}
		if st, err := readStat(child); err == nil && st.live() && st.ppid == parent {
			kids = append(kids, Child{Pid: child, start: st.start})
		}
	}
	return kids
}

// maxChildPasses bounds KillChildrenExcept's passes: each finds the
// children started since the one before, which only a thread of the parent
// that is still forking can add.
const maxChildPasses = 8

// KillChildrenExcept sends SIGKILL to every live child of parent that is
// not in keep, and returns the children of keep still alive. It is for a
// long-lived process that runs each call of a handler in itself (a Python
// worker), whose children are not orphans while it lives: keep is what
// ran before the call (what the last KillChildrenExcept, or Children after
// the handler was loaded, returned), so what is not in it the call
// started. A child is named by its pid and start time, never by what it
// says of itself: its environment may be read half-way through an exec,
// and a child that forked without exec carries its parent's. Each is
// signalled through a pidfd, after its parent and start time are checked
// again with the pidfd open, so a pid reused meanwhile is never hit. What
// a killed child started is orphaned to the Subreaper, if any.
func KillChildrenExcept(parent int, keep []Child) []Child {
	return killChildrenExcept(parent, keep, func() []Child { return Children(parent) })
}

func killChildrenExcept(parent int, keep []Child, children func() []Child) []Child {
	var signalled map[Child]bool
	var left []Child
	for range maxChildPasses {
		left = left[:0]
		fresh := false
		for _, c := range children() {
			switch {
			case slices.Contains(keep, c):
				left = append(left, c)
			case !signalled[c]:
				if signalled == nil {
					signalled = map[Child]bool{}
				}
				signalled[c] = true
				fresh = true
				killChild(c, parent)
			}
		}
		if !fresh {
			break
		}
	}
	return left
}

// killChild sends SIGKILL to c if it is (still) a child of parent.
func killChild(c Child, parent int) {
	fd, err := unix.PidfdOpen(c.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if st, err := readStat(c.Pid); err != nil || st.ppid != parent || st.start != c.start {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// parsePids parses a /proc children file: pids separated by spaces.
func parsePids(b []byte) []int {
	var pids []int
	for f := range bytes.FieldsSeq(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readProc reads the /proc file at path into buf, or, with dir, the names
// in the directory at path, each followed by a space.
func readProc(path string, buf []byte, dir bool) ([]byte, error) {
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var ents [2048]byte
	for {
		if !dir && len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(512, cap(buf)))
		}
		var k int
		if dir {
			k, err = unix.ReadDirent(fd, ents[:])
		} else {
			k, err = unix.Read(fd, buf[len(buf):cap(buf)])
		}
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, err
		case k == 0:
			return buf, nil
		case dir:
			var names []string
			_, _, names = unix.ParseDirent(ents[:k], -1, names)
			for _, name := range names {
				buf = append(append(buf, name...), ' ')
			}
		default:
			buf = buf[:len(buf)+k]
		}
	}
}
