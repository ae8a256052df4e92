package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Session names a session by its leader. A session outlives its leader,
// and a pid is reused once free, so a record of a session that must stay
// valid across a restart of Stoke holds the leader's start time as well.
type Session struct {
	// ID is the leader's pid, which is the session ID.
	ID int
	// Start is the leader's start time in clock ticks after boot
	// (/proc/PID/stat field 22).
	Start uint64
}

// SessionOf returns the session that pid leads.
func SessionOf(pid int) (Session, error) {
	st, err := readStat(pid)
	if err != nil {
		return Session{}, fmt.Errorf("session of %d: %w", pid, err)
	}
	if st.sid != pid {
		return Session{}, fmt.Errorf("session of %d: it does not lead a session (its session is %d)", pid, st.sid)
	}
	return Session{ID: pid, Start: st.start}, nil
}

// String is the text form ParseSession reads: "ID START".
func (s Session) String() string { return fmt.Sprintf("%d %d", s.ID, s.Start) }

// ParseSession reads a Session written by String.
func ParseSession(text string) (Session, error) {
	f := strings.Fields(text)
	if len(f) != 2 {
		return Session{}, fmt.Errorf("session %q: want \"ID START\"", text)
	}
	id, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Session{}, fmt.Errorf("session %q: %w", text, err)
	}
	if id <= 1 {
		return Session{}, fmt.Errorf("session %q: ID must be above 1", text)
	}
	return Session{ID: id, Start: start}, nil
}

// Kill kills what is left of s, as KillSession does, if s is still that
// session: its leader is alive with the recorded start time, or gone. The
// kernel does not reuse a number that a live process (a zombie included)
// holds as its session ID, so while anything of s is left no other
// process can have pid s.ID; a process with pid s.ID and another start
// time means nothing of s was left when the pid was reused, and then Kill
// signals nothing.
func (s Session) Kill(bound time.Duration) ([]int, error) {
	st, err := readStat(s.ID)
	switch {
	case err == nil && st.start != s.Start:
		return nil, nil
	case err != nil && !gone(err):
		return nil, fmt.Errorf("kill session %s: %w", s, err)
	}
	return KillSession(s.ID, bound)
}

// KillSession sends SIGKILL to every process of session sid and returns
// the pids it signalled. Processes may fork while it scans, so it scans
// /proc again (polling, with a short backoff) until a scan finds no live
// member — zombies run nothing, and their parent or init reaps them — or
// bound passes, which is an error. Each process is signalled through a
// pidfd, after its session is checked again with the pidfd open, so a pid
// that is reused between the scan and the kill is never hit. KillSession
// refuses sid ≤ 1 and the caller's own session. A process that left the
// session with setsid is not reached.
func KillSession(sid int, bound time.Duration) ([]int, error) {
	if sid <= 1 {
		return nil, fmt.Errorf("kill session %d: refused", sid)
	}
	own, err := unix.Getsid(0)
	if err != nil {
		return nil, fmt.Errorf("kill session %d: our own session: %w", sid, err)
	}
	if own == sid {
		return nil, fmt.Errorf("kill session %d: refused: it is our own", sid)
	}
	return killSession(sid, 0, bound)
}

// KillRestOfOwnSession kills every other process of the caller's session,
// as KillSession does, but only when the caller leads that session (a
// runtime pod started with NewSession): a process started from a terminal
// shares its user's session and must never kill it. Otherwise it does
// nothing.
func KillRestOfOwnSession(bound time.Duration) ([]int, error) {
	self := os.Getpid()
	own, err := unix.Getsid(0)
	if err != nil {
		return nil, fmt.Errorf("kill the rest of our session: %w", err)
	}
	if own != self {
		return nil, nil
	}
	return killSession(own, self, bound)
}

// killSession is KillSession's loop; except, when not 0, is spared.
func killSession(sid, except int, bound time.Duration) ([]int, error) {
	deadline := time.Now().Add(bound)
	delay := time.Millisecond
	var killed []int
	signalled := make(map[int]bool)
	for {
		live, err := SessionMembers(sid)
		if err != nil {
			return killed, fmt.Errorf("kill session %d: %w", sid, err)
		}
		live = slices.DeleteFunc(live, func(pid int) bool { return pid == except })
		if len(live) == 0 {
			return killed, nil
		}
		for _, pid := range live {
			killMember(pid, sid)
			if !signalled[pid] {
				signalled[pid] = true
				killed = append(killed, pid)
			}
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("kill session %d: processes %v still alive after %v", sid, live, bound)
		}
		time.Sleep(delay) // polling the kernel's process table
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// killMember sends SIGKILL to pid if it is (still) a member of session
// sid. Errors mean the process is gone; one that survives for another
// reason is found again by the next scan.
func killMember(pid, sid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No pidfds (before Linux 5.3, or a seccomp filter): the scan that
		// found pid is all the check there is.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return
	}
	if err != nil {
		return
	}
	defer unix.Close(fd)
	// The pidfd pins this process; if the pid was reused before it was
	// opened, /proc now shows the new process.
	if st, err := readStat(pid); err != nil || st.sid != sid {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// SessionMembers returns the live (not zombie) processes of session sid.
func SessionMembers(sid int) ([]int, error) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue // exited meanwhile
		}
		if st.sid == sid && st.live() {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// stat is what this package needs from /proc/PID/stat.
type stat struct {
	state byte
	ppid  int
	sid   int
	start uint64 // clock ticks after boot
	// envStart and envEnd bound the environment strings in the process's
	// memory (fields 50 and 51, since Linux 3.5; 0 where not shown). An
	// exec sets them anew, and they are 0 while it has not yet.
	envStart, envEnd uint64
}

// live reports whether the process runs (or can run): not a zombie.
func (s stat) live() bool { return s.state != 'Z' && s.state != 'X' && s.state != 'x' }

func readStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	return parseStat(b)
}

// gone reports whether err from readStat means the process does not exist
// (any more).
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// parseStat parses "pid (comm) state ppid pgrp session ... starttime ..."
// (proc_pid_stat(5)).
// comm may hold spaces and parentheses, so the fields are counted from the
// last ')': the text after it starts with field 3.
func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("parse /proc stat %q: no ')'", b)
	}
	f := bytes.Fields(b[i+1:])
	const startField = 22 - 3
	if len(f) <= startField || len(f[0]) != 1 {
		return stat{}, fmt.Errorf("parse /proc stat %q: too few fields", b)
	}
	ppid, err0 := strconv.Atoi(string(f[1]))
	sid, err1 := strconv.Atoi(string(f[3]))
	start, err2 := strconv.ParseUint(string(f[startField]), 10, 64)
	if err := errors.Join(err0, err1, err2); err != nil {
		return stat{}, fmt.Errorf("parse /proc stat: %w", err)
	}
	st := stat{state: f[0][0], ppid: ppid, sid: sid, start: start}
	const envStartField, envEndField = 50 - 3, 51 - 3
	if len(f) > envEndField {
		es, err3 := strconv.ParseUint(string(f[envStartField]), 10, 64)
		ee, err4 := strconv.ParseUint(string(f[envEndField]), 10, 64)
		if err := errors.Join(err3, err4); err != nil {
			return stat{}, fmt.Errorf("parse /proc stat: %w", err)
		}
		st.envStart, st.envEnd = es, ee
	}
	return st, nil
}
