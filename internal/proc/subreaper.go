package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
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
// told it to: adopting an orphan sends no signal, nor does an orphan's
// exec into another scope, and where the end of a scope does not follow
// the exit that orphaned its processes (a Bash child's exit is its warm
// shell's to see), this bounds how long they live on. Each look reads one
// small /proc file, and two for each orphan adopted.
const scanEvery = 200 * time.Millisecond

// unsureEvery is how soon an orphan whose environment could not be read
// whole (it was in the middle of an exec) is looked at again, and
// unsureBound how long that may go on before it is taken to have no scope:
// an exec takes far less, even on a loaded machine.
const (
	unsureEvery = 5 * time.Millisecond
	unsureBound = 2 * time.Second
)

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
// only this user can read), as the orphan's last exec set it. An orphan of
// a live scope lives until the scope ends; one of an ended scope, or with
// no scope known here (it cleared its environment), is killed at once.
//
// An orphan's scope is read again at every look, so one that execs into
// an ended scope after it was adopted is killed then. An environment that
// reads empty while the process's memory says it is not (an exec in
// progress: the old memory already gone, or the new one's environment not
// yet set up) decides nothing: the orphan is looked at again moments
// later. A process that forks without exec carries the environment its
// program was started with: a Python function's call that daemonises
// without exec leaves a process of the registration's scope, killed when
// the function ends rather than when the call does.
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
	scopes  map[string]map[int]bool // live scope → its adopted orphans (nil: none yet)
	orphans map[int]*orphan         // orphan seen alive and not yet reaped
	environ []byte                  // scan's buffer for an orphan's environment

	// children is the fd of this process's /proc/…/task/…/children, kept
	// open (0: not yet) from the first scan to the end of Sweep, and read
	// under startMu after every invocation (End): a read from offset 0 is
	// one system call where an open by path is a lookup in /proc, a read
	// and a close besides.
	children int
	kids     []byte // scan's buffer for it
}

// orphan is what a Subreaper knows of one orphan.
type orphan struct {
	scope string // the live scope it is attached to; "" none
	// unsure is when its environment first could not be read whole, in
	// the run of looks that has not read it since; zero otherwise.
	unsure time.Time
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
		scopes: map[string]map[int]bool{}, orphans: map[int]*orphan{}}, nil
}

// Begin opens a scope; a process started with ScopeEnv=name in its
// environment belongs to it. name must be unique for this process's life,
// not empty, and hold no '=' or NUL.
func (r *Subreaper) Begin(name string) {
	if name == "" {
		return
	}
	r.mu.Lock()
	r.scopes[name] = nil // its orphans' set is made for its first
	r.mu.Unlock()
}

// End closes scope name: the orphans attached to it are killed now, and
// any found later with its name are killed when found.
func (r *Subreaper) End(name string) {
	r.mu.Lock()
	pids := r.scopes[name]
	delete(r.scopes, name)
	for pid := range pids {
		r.orphans[pid].scope = ""
		// Still this process's child (reaped only by scan, under mu), so
		// the pid names it.
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	r.mu.Unlock()
	if len(pids) > 0 {
		r.log.Info("killed the orphans of an ended scope", "scope", name, "pids", len(pids))
	}
	if r.orphaned() {
		r.Poke()
	}
}

// orphaned says whether this process has a child that it did not start
// (an orphan for Run to look at), or cannot tell. End asks it before it
// wakes Run: End runs inside a Runtime Server's call, before the call's
// answer is written, and with one P (the server's GOMAXPROCS) a goroutine
// woken there ran ahead of the gRPC writer that would send the answer (an
// execution trace showed the scan between the two on every call), only to
// find, nearly always, no orphan. One read of the children list here costs
// less than that wake-up, and a scan finding none does nothing.
func (r *Subreaper) orphaned() bool {
	startMu.Lock()
	defer startMu.Unlock()
	b, err := r.readChildrenFile()
	if err != nil {
		return true // Run's scan logs it
	}
	trackedMu.Lock()
	defer trackedMu.Unlock()
	for f := range bytes.FieldsSeq(b) { // not parsePids: no slice per call
		if pid, err := strconv.Atoi(string(f)); err == nil && tracked[pid] == 0 {
			return true
		}
	}
	return false
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
	again := time.NewTimer(unsureEvery)
	defer again.Stop()
	for {
		var soon <-chan time.Time
		if _, unsure := r.scan(false); unsure {
			again.Reset(unsureEvery)
			soon = again.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-sigc:
		case <-r.poke:
		case <-t.C:
		case <-soon:
		}
	}
}

// Sweep ends every scope and kills every orphan, again and again as the
// killed ones' children are adopted in turn, until a look finds none left
// or bound passes (an error then). A Runtime Server calls it when it
// stops, after the processes it started itself are gone.
func (r *Subreaper) Sweep(bound time.Duration) error {
	r.mu.Lock()
	clear(r.scopes)
	clear(r.orphans)
	r.mu.Unlock()
	deadline := time.Now().Add(bound)
	delay := time.Millisecond
	defer r.closeChildren()
	for {
		if found, _ := r.scan(true); found == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("orphans still alive %v after the sweep began", bound)
		}
		time.Sleep(delay) // polling: a killed orphan's children are adopted with no event
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// readChildren lists this process's children (those of its main thread,
// to which Linux hands orphans); startMu must be held.
func (r *Subreaper) readChildren() ([]int, error) {
	b, err := r.readChildrenFile()
	if err != nil {
		return nil, err
	}
	return parsePids(b), nil
}

// readChildrenFile reads the file readChildren parses into a buffer that
// the next read reuses; startMu must be held.
func (r *Subreaper) readChildrenFile() ([]byte, error) {
	if r.children <= 0 {
		fd, err := unix.Open("/proc/"+strconv.Itoa(r.self)+"/task/"+strconv.Itoa(r.self)+"/children", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		r.children = fd
	}
	b, err := preadAll(r.children, r.kids[:0])
	r.kids = b[:0]
	return b, err
}

// closeChildren closes what readChildren keeps open.
func (r *Subreaper) closeChildren() {
	startMu.Lock()
	defer startMu.Unlock()
	if r.children > 0 {
		_ = unix.Close(r.children)
		r.children = 0
	}
}

// scan sorts this process's children: tracked ones are left alone; an
// orphan that has exited is reaped; a live one is attached to its scope
// if that is live, otherwise (or with all) killed. It returns how many
// orphans it found, and whether the scope of one could not be read whole
// (then it should look again soon).
func (r *Subreaper) scan(all bool) (found int, unsure bool) {
	startMu.Lock()
	kids, err := r.readChildren()
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
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for _, pid := range orphans {
		st, err := readStat(pid)
		if err != nil || !st.live() {
			// Exited: reap it. Only a pid found orphaned is waited for.
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil || errors.Is(err, unix.ECHILD) {
				r.forget(pid)
			}
			continue
		}
		if all {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			continue
		}
		o := r.orphans[pid]
		if o == nil {
			o = &orphan{}
			r.orphans[pid] = o
		}
		scope, whole := r.readScope(pid, st)
		switch {
		case whole:
			o.unsure = time.Time{}
		case o.unsure.IsZero():
			o.unsure = now
			unsure = true
			continue
		case now.Sub(o.unsure) < unsureBound:
			unsure = true
			continue
		default:
			scope = "" // never readable: no scope known here
		}
		if pids, live := r.scopes[scope]; live {
			if o.scope != scope {
				delete(r.scopes[o.scope], pid)
				if pids == nil {
					pids = map[int]bool{}
					r.scopes[scope] = pids
				}
				pids[pid] = true
				o.scope = scope
				r.log.Debug("adopted an orphan", "pid", pid, "scope", scope)
			}
			continue
		}
		delete(r.scopes[o.scope], pid)
		o.scope = ""
		_ = syscall.Kill(pid, syscall.SIGKILL)
		r.log.Info("killed an orphan whose scope has ended", "pid", pid, "scope", scope)
	}
	return len(orphans), unsure
}

// forget drops what is known of orphan pid, which has been reaped.
func (r *Subreaper) forget(pid int) {
	if o, ok := r.orphans[pid]; ok {
		delete(r.scopes[o.scope], pid)
		delete(r.orphans, pid)
	}
}

// maxEnviron bounds the environment readEnviron reads: far above what
// execve accepts under a default stack limit (a quarter of 8 MiB).
const maxEnviron = 16 << 20

// readEnviron reads pid's environment in one read(2), which the kernel
// serves from one memory image: read in several, as os.ReadFile does, an
// environment can end early, cut where an exec replaced that image between
// two reads. A buffer the read fills is too small, and a bigger one is
// tried.
// *buf is the buffer to use, grown as needed.
func readEnviron(pid int, buf *[]byte) ([]byte, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/environ", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if len(*buf) == 0 {
		*buf = make([]byte, 64<<10)
	}
	for {
		n, err := unix.Pread(fd, *buf, 0)
		if err != nil {
			return nil, err
		}
		if n < len(*buf) {
			return (*buf)[:n], nil
		}
		if len(*buf) >= maxEnviron {
			return nil, fmt.Errorf("environment of %d: over %d bytes", pid, maxEnviron)
		}
		*buf = make([]byte, 4*len(*buf))
	}
}

// readScope reads ScopeEnv from the environment of pid, whose stat st has
// just been read, as pid's last exec set it; "" if it has none. whole is
// false when the environment could not be read whole: pid is exiting, or
// in the middle of an exec, whose old memory may be gone before the new
// one's environment is set up, so that it reads empty for a moment. An
// environment that really is empty has the same non-zero bounds in the
// process's memory before and after it is read.
func (r *Subreaper) readScope(pid int, st stat) (scope string, whole bool) {
	b, err := readEnviron(pid, &r.environ)
	if err != nil {
		return "", false
	}
	if len(b) == 0 {
		after, err := readStat(pid)
		if err != nil || st.envEnd == 0 || after.envStart != st.envStart || after.envEnd != st.envEnd {
			return "", false
		}
		return "", true
	}
	prefix := []byte(ScopeEnv + "=")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v), true
		}
	}
	return "", true
}
