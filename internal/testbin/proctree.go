package testbin

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// ProcTree is each live process's parent, read from /proc: the test
// binaries' way to find the processes a `stoke` they started has started.
type ProcTree map[int]int

// ReadProcTree reads every process's parent pid from /proc/PID/stat. A
// process that exits meanwhile is left out.
func ReadProcTree() (ProcTree, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	parent := ProcTree{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so from its ')'.
		f := bytes.Fields(st[bytes.LastIndexByte(st, ')')+1:])
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(string(f[1]))
		}
	}
	return parent, nil
}

// Under reports whether pid descends from root (root itself is not under
// itself).
func (t ProcTree) Under(pid, root int) bool {
	for p := t[pid]; p > 1; p = t[p] {
		if p == root {
			return true
		}
	}
	return false
}
