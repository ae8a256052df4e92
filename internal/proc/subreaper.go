package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ScopeEnv is the environment variable that names the scope a process was
// started in: every process a Run starts inherits it, so an orphan can be
// traced back to the task, registration or invocation it came from.
const ScopeEnv = "STOKE_SCOPE"

// scanEvery is how often a Subreaper looks for new orphans when nothing
// told it to: adopting an orphan sends no signal, and where the end of a
// scope does not follow the exit that orphaned its processes (a Bash
// child's exit is its warm shell's to see), this bounds how long they
// live on. Each look reads one small /proc file.
const scanEvery = 200 * time.Millisecond

// Children this process started with Start, so that a Subreaper never
// touches them: os/exec waits for each by pid and must find it unreaped.
// Start holds startMu for reading from the fork until the pid is in
// tracked; a scan holds it for writing while it sorts the children, so a
// child forked but not yet recorded is never taken for an orphan.
var (
	startMu   sync.RWMutex
	trackedMu sync.Mutex
	tracked   = map[int]int{} // pid → count (a pid reused before its entry went)
)

func track(pid int) {
	trackedMu.Lock()
	tracked[pid]++
	trackedMu.Unlock()
}

func untrack(pid int) {
	trackedMu.Lock()
	if tracked[pid]--; tracked[pid] <= 0 {
		delete(tracked, pid)
	}
	trackedMu.Unlock()
}

// Subreaper makes this process the child subreaper of everything it starts
// (prctl PR_SET_CHILD_SUBREAPER): a process whose parent dies — one that
// called setsid, double-forked or daemonised — becomes this process's
// child instead of init's. The Subreaper finds those orphans, reaps them
// when they exit, and kills them when the scope they came from ends: it
// reads ScopeEnv from the orphan's environment (/proc/PID/environ, which
// only this user can read). An orphan of a live scope lives until the
// scope ends; one of an ended scope, or with no scope known here (it
// cleared its environment), is killed at once.
//
// Every child of a process with a Subreaper must be started with Start:
// a child started otherwise would be taken for an orphan. Only one
// Subreaper may run in a process; it never waits for a pid it did not
// find orphaned, so os/exec's own waits are never raced.
type Subreaper struct {
	log  *slog.Logger
	self int
	poke chan struct{}

	mu      sync.Mutex
	scopes  map[string]map[int]bool // live scope → its adopted orphans
	orphans map[int]string          // adopted orphan → its live scope
}

// NewSubreaper makes this process a child subreaper. Run must run for
// orphans to be collected.
func NewSubreaper(log *slog.Logger) (*Subreaper, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become a child subreaper: %w", err)
	}
	return &Subreaper{log: log, self: os.Getpid(), poke: make(chan struct{}, 1),
		scopes: map[string]map[int]bool{}, orphans: map[int]string{}}, nil
}

// Begin opens a scope; a process started with ScopeEnv=name in its
// environment belongs to it. name must be unique for this process's life
// and hold no '=' or NUL.
func (r *Subreaper) Begin(name string) {
	r.mu.Lock()
	r.scopes[name] = map[int]bool{}
	r.mu.Unlock()
}

// End closes scope name: the orphans adopted from it are killed now, and
// any adopted later are killed when found.
func (r *Subreaper) End(name string) {
	r.mu.Lock()
	pids := r.scopes[name]
	delete(r.scopes, name)
	for pid := range pids {
		delete(r.orphans, pid)
		// Still this process's child (reaped only by scan, under mu), so
		// the pid names it.
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	r.mu.Unlock()
	if len(pids) > 0 {
		r.log.Info("killed the orphans of an ended scope", "scope", name, "pids", len(pids))
	}
	r.Poke()
}

// Poke asks Run to look for orphans now, e.g. after a process of a scope
// exited and left children behind.
func (r *Subreaper) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Run collects orphans until ctx ends. What is left then is for Sweep.
func (r *Subreaper) Run(ctx context.Context) error {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	t := time.NewTicker(scanEvery)
	defer t.Stop()
	for {
		r.scan(false)
		select {
		case <-ctx.Done():
			return nil
		case <-sigc:
		case <-r.poke:
		case <-t.C:
		}
	}
}

// Sweep ends every scope and kills every orphan, again and again as the
// killed ones' children are adopted in turn, until none is left or bound
// passes (an error then). A Runtime Server calls it when it stops, after
// the processes it started itself are gone.
func (r *Subreaper) Sweep(bound time.Duration) error {
	r.mu.Lock()
	clear(r.scopes)
	clear(r.orphans)
	r.mu.Unlock()
	deadline := time.Now().Add(bound)
	delay := time.Millisecond
	for {
		if left := r.scan(true); left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("orphans still alive %v after the sweep began", bound)
		}
		time.Sleep(delay) // polling: a killed orphan's children are adopted with no event
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// scan sorts this process's children: tracked ones are left alone; an
// orphan that has exited is reaped; a live one is attached to its scope
// if that is live, otherwise (or with all) killed. It returns how many
// orphans it found.
func (r *Subreaper) scan(all bool) int {
	startMu.Lock()
	kids, err := children(r.self)
	trackedMu.Lock()
	orphans := kids[:0]
	for _, pid := range kids {
		if tracked[pid] == 0 {
			orphans = append(orphans, pid)
		}
	}
	trackedMu.Unlock()
	startMu.Unlock()
	if err != nil {
		r.log.Warn("cannot list this process's children", "err", err)
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range orphans {
		st, err := readStat(pid)
		if err != nil || !st.live() {
			// Exited: reap it. Only a pid found orphaned is waited for.
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil || errors.Is(err, unix.ECHILD) {
				if scope, ok := r.orphans[pid]; ok {
					delete(r.orphans, pid)
					delete(r.scopes[scope], pid)
				}
			}
			continue
		}
		if _, ok := r.orphans[pid]; ok && !all {
			continue // attached to a live scope already
		}
		scope := scopeOf(pid)
		if pids, live := r.scopes[scope]; live && !all {
			pids[pid] = true
			r.orphans[pid] = scope
			r.log.Debug("adopted an orphan", "pid", pid, "scope", scope)
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if !all {
			r.log.Info("killed an orphan whose scope has ended", "pid", pid, "scope", scope)
		}
	}
	return len(orphans)
}

// children lists the children of this process. Orphans are always adopted
// by the main thread (the kernel picks the first live thread of the
// subreaper, and Go never ends the main thread), so only its list is read;
// children that other threads forked are Start's, which scan skips anyway.
func children(self int) ([]int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(self) + "/task/" + strconv.Itoa(self) + "/children")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// scopeOf reads ScopeEnv from pid's environment as it was when pid last
// called exec; "" if it has none.
func scopeOf(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	prefix := []byte(ScopeEnv + "=")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v)
		}
	}
	return ""
}

// KillChildrenInScope kills the children of pid (any of its threads')
// that belong to scope: for a long-lived process that runs handlers in
// itself (a Python worker), whose children are not orphans while it
// lives. Each is signalled through a pidfd, after its parent is checked
// again with the pidfd open, so a pid reused meanwhile is never hit. It
// returns how many it killed.
func KillChildrenInScope(pid int, scope string) int {
	// Called after every Python invocation: raw system calls into one
	// buffer, as os.Open would also stat each file and try to register it
	// with the poller, which costs more here than the reads.
	var stack [4096]byte
	base := "/proc/" + strconv.Itoa(pid) + "/task/"
	tids, err := readProc(base, stack[:0], true)
	if err != nil {
		return 0
	}
	n := 0
	for t := range bytes.FieldsSeq(tids) {
		b, err := readProc(base+string(t)+"/children", nil, false)
		if err != nil {
			continue
		}
		for f := range bytes.FieldsSeq(b) {
			child, err := strconv.Atoi(string(f))
			if err != nil || scopeOf(child) != scope {
				continue
			}
			if killChild(child, pid) {
				n++
			}
		}
	}
	return n
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

// killChild sends SIGKILL to child if it is (still) a child of parent.
func killChild(child, parent int) bool {
	fd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if st, err := readStat(child); err != nil || st.ppid != parent {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}
