package pool

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"time"

	"stoke.dev/stoke/internal/proc"
)

// fenceWait bounds how long fence waits for killed processes to be gone.
const fenceWait = 5 * time.Second

// fence makes sure nothing of a pod runs any more, and returns once that is
// so (or after fenceWait, with a warning).
//
// The Runtime Server leads its own process group, but it starts user code
// (tasks, warm shells, Python workers) in process groups of their own, and
// those would outlive a killed server: its direct children get a
// parent-death signal, their children do not. So, while the server still
// runs, fence first stops its group (SIGSTOP: it can start nothing more and
// reaps nobody, so no pid found below can be reused meanwhile), finds the
// process groups of all its descendants in /proc, stopping each as it is
// found, and kills them; then it kills the server's group and waits for the
// server to be reaped. Last it waits until no live member of any of those
// groups is left (zombies, which run nothing, do not count).
//
// When the server has already exited, its descendants cannot be found any
// more; only its own group is killed. Its direct children die by their
// parent-death signal.
func fence(p *proc.Process, log *slog.Logger) {
	groups := []int{p.Pid()}
	select {
	case <-p.Done():
	default:
		_ = syscall.Kill(-p.Pid(), syscall.SIGSTOP)
		for _, g := range descendantGroups(p.Pid()) {
			_ = syscall.Kill(-g, syscall.SIGKILL)
			groups = append(groups, g)
		}
	}
	p.Kill(0) // SIGKILL to the group; returns once the server is reaped
	if !awaitGroupsGone(groups, fenceWait) {
		log.Warn("processes of a killed pod are still running", "process_groups", groups)
	}
}

// descendantGroups returns the process groups, other than root's own, of
// the processes descended from root, sending each SIGSTOP as it is found.
// It scans /proc until a scan finds no new group (a bounded number of
// times), so a process forked during a scan is found by the next.
func descendantGroups(root int) []int {
	self := syscall.Getpgrp()
	seen := map[int]bool{root: true, self: true}
	var groups []int
	for range 8 {
		table, err := readProcTable()
		if err != nil {
			return groups
		}
		children := make(map[int][]int)
		for pid, e := range table {
			children[e.ppid] = append(children[e.ppid], pid)
		}
		found := false
		queue := []int{root}
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			for _, c := range children[pid] {
				queue = append(queue, c)
				g := table[c].pgid
				if g <= 1 || seen[g] {
					continue
				}
				seen[g] = true
				found = true
				groups = append(groups, g)
				_ = syscall.Kill(-g, syscall.SIGSTOP)
			}
		}
		if !found {
			break
		}
	}
	return groups
}

// awaitGroupsGone polls until no process group in groups has a live
// (non-zombie) member, or bound passes; it reports whether they are gone.
func awaitGroupsGone(groups []int, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	delay := time.Millisecond
	for {
		if !groupsAlive(groups) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay) // polling the kernel's process table
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// groupsAlive reports whether any of groups has a member that is not a
// zombie.
func groupsAlive(groups []int) bool {
	present := false
	for _, g := range groups {
		if g > 1 && !errors.Is(syscall.Kill(-g, 0), syscall.ESRCH) {
			present = true
			break
		}
	}
	if !present {
		return false
	}
	// Some group still has members; zombies (whose parent has not reaped
	// them yet, or an init that never does) run nothing.
	table, err := readProcTable()
	if err != nil {
		return true
	}
	want := make(map[int]bool, len(groups))
	for _, g := range groups {
		want[g] = true
	}
	for _, e := range table {
		if want[e.pgid] && e.state != 'Z' && e.state != 'X' {
			return true
		}
	}
	return false
}

// procEntry is what fence needs from /proc/<pid>/stat.
type procEntry struct {
	state byte
	ppid  int
	pgid  int
}

// readProcTable reads every process's state, parent and process group.
func readProcTable() (map[int]procEntry, error) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	table := make(map[int]procEntry, len(dir))
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if e, ok := parseStat(b); ok {
			table[pid] = e
		}
	}
	return table, nil
}

// parseStat parses "pid (comm) state ppid pgrp ..."; comm may hold spaces
// and parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (procEntry, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procEntry{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return procEntry{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return procEntry{}, false
	}
	return procEntry{state: f[0][0], ppid: ppid, pgid: pgid}, true
}
