package bash

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/loglines"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime"
)

// tailMax bounds the stderr kept per invocation (and while loading) for
// error messages; everything is logged regardless.
const tailMax = 2 << 10

// instance is one warm shell: a runtime.Instance.
type instance struct {
	log   *slog.Logger // spec.Logger
	grace time.Duration
	proc  *proc.Process
	// marker is "\x1e<nonce> ", which starts the trailer a child writes
	// after the function's stdout and the sync markers on stderr.
	marker []byte
	ctl    *os.File // control pipe, write end: one request number per request
	status *os.File // status pipe, read end
	stderr *os.File // stderr of the warm shell and every child, read end
	// statusW and stderrW are write ends of Go's own, for the sync lines
	// that tell when a reader has read everything written before them.
	statusW *os.File
	stderrW *os.File
	// scratch is this instance's own directory inside spec.ScratchDir (a
	// replacement instance gets another), holding req.N, out.N and
	// outputs.N; dirfd is it opened, for lookups that do not walk the path.
	scratch string
	dirfd   int

	// The status reader and the stderr pump stop at end-of-file, which
	// Close forces after a grace period.
	statusDone chan struct{}
	pumpDone   chan struct{}
	// dead is cancelled when the warm shell has exited, by a goroutine
	// that ends then (deadDone); it wakes an invocation reading stdout.
	dead     context.Context
	deadDone chan struct{}

	initDone chan struct{} // closed by the status reader at "ready" or "init …"
	initMsg  string        // valid once initDone is closed
	initTail tail          // stderr outside invocations

	mu     sync.Mutex
	cur    *child // the newest child announced that has not ended
	active *call  // the invocation in flight
	// logging are the invocations whose stderr the pump may still be
	// reading, oldest first: each stays until the pump reads the sync
	// marker written after it ended.
	logging []*call
	// trailerPids are the children whose trailer was read before their
	// exit was reported: their exits belong to invocations already over.
	trailerPids map[int]bool
	syncs       map[uint64]*syncWait // sync lines waited for and not yet read back
	syncSeq     uint64
	closed      bool // no more prepare goroutines

	slots     chan *slot     // the next request's files; capacity 1
	prepWG    sync.WaitGroup // prepare goroutines
	closeOnce sync.Once
}

// child is one pre-forked child of the warm shell.
type child struct {
	pid  int
	done chan struct{} // closed when the warm shell reported its exit
}

// call is one invocation.
type call struct {
	seq    uint64
	log    *slog.Logger
	stderr tail // bounded tail of its stderr

	// done is closed (under instance.mu) when the result is known: at the
	// trailer, or at the exit of the child that took the request when it
	// wrote none (exit, set -e, a signal).
	done    chan struct{}
	rc      int
	trailer bool   // the result came from the trailer
	endSync uint64 // the sync marker written after it ended; 0 before
	wake    func() // interrupts Invoke's read of stdout
}

// finishLocked records c's exit status once; instance.mu is held.
func (c *call) finishLocked(rc int, trailer bool) {
	select {
	case <-c.done:
	default:
		c.rc, c.trailer = rc, trailer
		close(c.done)
	}
}

// start starts the warm shell, its status reader and stderr pump, and the
// goroutine that notices its death.
func start(a *Adapter, spec runtime.FunctionSpec, path, fn, nonce string) (in *instance, err error) {
	scratch := filepath.Join(spec.ScratchDir, "bash-"+nonce)
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return nil, err
	}
	dirfd, err := syscall.Open(scratch, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		_ = os.RemoveAll(scratch)
		return nil, err
	}
	var files []*os.File // closed on failure
	defer func() {
		if err != nil {
			closeAll(files...)
			_ = syscall.Close(dirfd)
			_ = os.RemoveAll(scratch)
		}
	}()
	var pipes [6]*os.File // status r/w, control r/w, stderr r/w
	for i := 0; i < len(pipes); i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			return nil, err
		}
		files = append(files, pipes[i], pipes[i+1])
	}
	statusR, statusW, ctlR, ctlW, stderrR, stderrW := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5]

	cmd := exec.Command(a.bash, "--noprofile", "--norc", "-c", bootstrap, "stoke-bash",
		path, fn, scratch, nonce, spec.RunUID)
	cmd.Dir = spec.WorkingDir
	cmd.Env = spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{} // nil would mean the server's own environment
	}
	// Stdin stays nil: /dev/null. Stdout of the warm shell is what the
	// file prints while it is sourced: a log, not an output.
	cmd.Stdout, cmd.Stderr = stderrW, stderrW
	cmd.ExtraFiles = []*os.File{statusW, ctlR} // fds 3 and 4
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, err
	}
	_ = ctlR.Close() // the warm shell holds its own copy
	dead, cancelDead := context.WithCancel(context.Background())
	in = &instance{
		log: spec.Logger, grace: a.grace, proc: p,
		marker:      []byte("\x1e" + nonce + " "),
		ctl:         ctlW,
		status:      statusR,
		stderr:      stderrR,
		statusW:     statusW,
		stderrW:     stderrW,
		scratch:     scratch,
		dirfd:       dirfd,
		statusDone:  make(chan struct{}),
		pumpDone:    make(chan struct{}),
		dead:        dead,
		deadDone:    make(chan struct{}),
		initDone:    make(chan struct{}),
		trailerPids: map[int]bool{},
		syncs:       map[uint64]*syncWait{},
		slots:       make(chan *slot, 1),
	}
	go in.readStatus()
	go in.pumpStderr()
	go func() {
		defer close(in.deadDone)
		<-p.Done()
		cancelDead()
	}()
	in.prepare(1, nil, nil)
	return in, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// readStatus follows the status pipe until every writer is gone: the warm
// shell, its children and Go's own write end, which Close closes.
func (in *instance) readStatus() {
	defer close(in.statusDone)
	sc := bufio.NewScanner(in.status)
	initialised := false
	for sc.Scan() {
		line := sc.Text()
		if !initialised && (line == "ready" || strings.HasPrefix(line, "init ")) {
			in.initMsg = line
			initialised = true
			close(in.initDone)
			continue
		}
		in.handleStatus(line)
	}
}

// handleStatus applies one "pid", "exit" or "sync" line.
func (in *instance) handleStatus(line string) {
	f := strings.Fields(line)
	if len(f) < 2 {
		in.log.Warn("bash runtime: unexpected status line", "line", line)
		return
	}
	n, _ := strconv.Atoi(f[1])
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case f[0] == "pid":
		in.cur = &child{pid: n, done: make(chan struct{})}
	case f[0] == "exit" && len(f) == 4:
		rc, _ := strconv.Atoi(f[2])
		// Whatever the child left running in its group goes with it,
		// before its invocation's end is reported.
		proc.KillGroup(n, 0, nil)
		if c := in.cur; c != nil && c.pid == n {
			in.cur = nil
			close(c.done)
		}
		switch a := in.active; {
		case in.trailerPids[n]:
			// Its invocation ended at the trailer.
			delete(in.trailerPids, n)
		case f[3] == "1":
			// It died before it read the request line, which the next
			// child will take. (abort kills idle children too.)
			in.log.Debug("bash runtime: idle child ended", "pid", n, "status", rc)
		case a != nil:
			// Children take requests one at a time, and the exits of
			// those that took earlier ones have been read (or are in
			// trailerPids): this one took a's.
			a.finishLocked(rc, false)
			if a.wake != nil {
				a.wake()
			}
		default:
			in.log.Debug("bash runtime: idle child ended", "pid", n, "status", rc)
		}
	case f[0] == "sync":
		in.syncedLocked(uint64(n))
	default:
		in.log.Warn("bash runtime: unexpected status line", "line", line)
	}
}

// pumpStderr logs stderr line by line, with the invocation it belongs to,
// and acts on the sync markers.
func (in *instance) pumpStderr() {
	defer close(in.pumpDone)
	loglines.Pump(in.stderr, func(line []byte) {
		if len(line) == 0 {
			// Each sync marker starts with a newline to end a partial
			// line, which leaves blank lines that carry nothing.
			return
		}
		// A marker starts with a newline of its own, but a background job
		// writing at the same moment can still precede it on its line.
		if i := bytes.Index(line, in.marker); i >= 0 {
			rest := string(line[i+len(in.marker):])
			if k, ok := strings.CutPrefix(rest, "sync "); ok {
				n, _ := strconv.ParseUint(k, 10, 64)
				in.mu.Lock()
				in.syncedLocked(n)
				in.mu.Unlock()
			}
			if line = line[:i]; len(line) == 0 {
				return
			}
		}
		in.mu.Lock()
		var c *call
		if len(in.logging) > 0 {
			c = in.logging[0]
		}
		in.mu.Unlock()
		log := in.log
		if c != nil {
			log = c.log
			c.stderr.add(line)
		} else {
			in.initTail.add(line)
		}
		log.Info("output", "stream", "stderr", "line", string(line))
	})
}

// syncWait is the waiter of one sync line.
type syncWait struct {
	done chan struct{} // closed when the line is read back
	cur  *child        // then: the newest child announced and not ended
}

// syncedLocked acts on sync marker k: the invocations that ended before it
// have no more stderr to come, and its waiter, if any, wakes up.
// instance.mu is held.
func (in *instance) syncedLocked(k uint64) {
	for len(in.logging) > 0 && in.logging[0].endSync != 0 && in.logging[0].endSync <= k {
		in.logging = in.logging[1:]
	}
	if w := in.syncs[k]; w != nil {
		w.cur = in.cur
		close(w.done)
		delete(in.syncs, k)
	}
}

// sync writes a sync line to w, the write end of the status or the stderr
// pipe. With c, it marks the end of c's stderr. With wait, it returns once
// the pipe's reader has read everything written before (or after the grace
// period), and for the status pipe, with ok, the newest child announced and
// not ended at that point (nil if none).
func (in *instance) sync(w *os.File, c *call, wait bool) (cur *child, ok bool) {
	in.mu.Lock()
	in.syncSeq++
	k := in.syncSeq
	if c != nil {
		c.endSync = k
	}
	var sw *syncWait
	if wait {
		sw = &syncWait{done: make(chan struct{})}
		in.syncs[k] = sw
	}
	in.mu.Unlock()
	if wait {
		defer func() {
			in.mu.Lock()
			delete(in.syncs, k)
			in.mu.Unlock()
		}()
	}
	line := fmt.Sprintf("sync %d\n", k)
	if w == in.stderrW {
		line = "\n" + string(in.marker) + line
	}
	deadline := time.Now().Add(in.grace)
	_ = w.SetWriteDeadline(deadline)
	if _, err := w.WriteString(line); err != nil || !wait {
		return nil, false
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-sw.done:
		in.mu.Lock()
		defer in.mu.Unlock()
		return sw.cur, true
	case <-t.C:
	case <-in.pumpDone:
	case <-in.statusDone:
	}
	return nil, false
}

// Done implements runtime.Instance: the warm shell has exited.
func (in *instance) Done() <-chan struct{} { return in.proc.Done() }

// Close implements runtime.Instance.
func (in *instance) Close() error {
	in.closeOnce.Do(func() {
		in.mu.Lock()
		in.closed = true
		in.mu.Unlock()
		in.proc.Kill(0)
		in.killChild()
		// A child forked but not yet announced (or announced after the
		// kill) reads end-of-file on the control pipe and exits.
		_ = in.ctl.Close()
		_ = in.statusW.Close()
		_ = in.stderrW.Close()
		// Both readers end at end-of-file; a process that left its process
		// group may hold a pipe open, so after the grace period they are
		// cut off.
		t := time.NewTimer(in.grace)
		defer t.Stop()
		expired := false
		await := func(done <-chan struct{}, f *os.File) {
			if !expired {
				select {
				case <-done:
					return
				case <-t.C:
					expired = true
				}
			}
			in.log.Warn("bash runtime: a pipe is still open after the runtime was killed", "pipe", f.Name())
			_ = f.Close()
			<-done
		}
		await(in.statusDone, in.status)
		// The status pipe is drained: cur is now the last child there was.
		in.killChild()
		await(in.pumpDone, in.stderr)
		closeAll(in.status, in.stderr)
		<-in.deadDone
		in.prepWG.Wait()
		select {
		case s := <-in.slots:
			s.close()
		default:
		}
		_ = syscall.Close(in.dirfd)
		if err := os.RemoveAll(in.scratch); err != nil {
			in.log.Warn("bash runtime: removing scratch directory", "error", err)
		}
	})
	return nil
}

func (in *instance) killChild() {
	in.mu.Lock()
	c := in.cur
	in.mu.Unlock()
	if c != nil {
		proc.KillGroup(c.pid, 0, nil)
	}
}

// runtimeExited is the error of an invocation whose warm shell died. It is
// new every time: the core sets the invocation ID in it.
func runtimeExited() error {
	return &errdefs.FunctionError{Type: "Runtime.ExitError", Message: "the bash runtime exited during the invocation"}
}

// Invoke implements runtime.Instance.
func (in *instance) Invoke(ctx context.Context, inv runtime.Invocation) (runtime.Result, error) {
	if bytes.IndexByte(inv.Input, 0) >= 0 {
		// Valid JSON never has one; a bash variable cannot hold one.
		return runtime.Result{}, errdefs.InvalidArgument("input", "contains a NUL byte")
	}
	log := inv.Logger
	if log == nil {
		log = in.log
	}
	var s *slot
	select {
	case s = <-in.slots:
	case <-in.proc.Done():
		return runtime.Result{}, errdefs.Errorf(errdefs.ErrUnavailable, "bash runtime has exited")
	case <-ctx.Done():
		return runtime.Result{}, ctx.Err()
	}
	if s.err != nil {
		in.prepare(s.seq+1, s, nil)
		return runtime.Result{}, fmt.Errorf("prepare request files: %w", s.err)
	}
	n := strconv.FormatUint(s.seq, 10)

	// The request file holds the ID and the payload, each ending in a NUL;
	// a bash variable cannot hold NUL, so the ID loses any. It is written
	// over the zeros prepare put there: see reqPrefill.
	id := strings.ReplaceAll(inv.ID, "\x00", "")
	req := make([]byte, 0, len(id)+len(inv.Input)+2)
	req = append(append(req, id...), 0)
	req = append(append(req, inv.Input...), 0)
	if _, err := s.req.WriteAt(req, 0); err != nil {
		in.prepare(s.seq+1, s, nil)
		return runtime.Result{}, fmt.Errorf("write request: %w", err)
	}

	c := &call{seq: s.seq, log: log, done: make(chan struct{})}
	in.mu.Lock()
	in.active = c
	in.logging = append(in.logging, c)
	in.mu.Unlock()
	res, err := in.run(ctx, c, s, n)
	in.mu.Lock()
	in.active = nil
	in.mu.Unlock()
	// The next request gets fresh files, prepared (and this one's removed)
	// while nobody waits for it; the end of this invocation's stderr is
	// marked at once.
	in.prepare(s.seq+1, s, c)
	return res, err
}

// run runs invocation c, whose request file is written, and waits for its
// result. It reads the function's stdout itself, so that the trailer wakes
// it directly; whatever else ends the wait (ctx, the child's exit, the warm
// shell's death) interrupts the read with a deadline in the past.
func (in *instance) run(ctx context.Context, c *call, s *slot, n string) (runtime.Result, error) {
	f := s.out
	in.mu.Lock()
	c.wake = func() { _ = f.SetReadDeadline(time.Now()) }
	in.mu.Unlock()
	defer context.AfterFunc(ctx, c.wake)()
	defer context.AfterFunc(in.dead, c.wake)()
	if _, err := in.ctl.Write([]byte(n + "\n")); err != nil {
		return runtime.Result{}, fmt.Errorf("send request: %w", err)
	}

	out := newOutput(in.marker, s.seq)
	var tooLarge, dead, exited bool
read:
	for {
		nr, err := f.Read(out.space())
		out.took(nr)
		switch {
		case out.findTrailer():
			in.mu.Lock()
			in.trailerFoundLocked(c, out)
			in.mu.Unlock()
			break read
		case out.over():
			tooLarge = true
			in.abort(s.path("req"))
			break read
		case err == nil:
			continue
		case !errors.Is(err, os.ErrDeadlineExceeded):
			exited = true // end-of-file cannot come while Go holds the keeper
			break read
		}
		// Woken. Clear the deadline first, so that a wake-up that comes
		// while the reasons are checked is not lost.
		_ = f.SetReadDeadline(time.Time{})
		switch {
		case ctx.Err() != nil:
			in.abort(s.path("req"))
		case in.dead.Err() != nil:
			dead = true
			in.abort(s.path("req"))
		case isClosed(c.done):
			exited = true
		default:
			continue
		}
		break
	}
	if exited {
		// The child ended without a trailer: read the rest of its output
		// until every writer is gone, which is late only if a process that
		// left the child's group holds the FIFO.
		s.closeKeeper()
		_ = f.SetReadDeadline(time.Now().Add(in.grace))
		for !out.findTrailer() {
			nr, err := f.Read(out.space())
			out.took(nr)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					in.log.Warn("bash runtime: handler stdout still open after the handler ended")
				}
				out.out = out.buf
				break
			}
		}
		select {
		case <-c.done:
		case <-ctx.Done():
		case <-in.dead.Done():
			dead = true
		}
	}
	in.mu.Lock()
	if exited && out.trailer {
		// Found while draining after the child's exit was reported.
		in.trailerFoundLocked(c, out)
	}
	rc, trailer := c.rc, c.trailer
	in.mu.Unlock()
	if !trailer || rc != 0 {
		// Wait until the pump has read what the child wrote to stderr, so
		// that this call's lines are logged as its own and its tail is
		// complete.
		in.sync(in.stderrW, c, true)
	}

	switch {
	case ctx.Err() != nil:
		return runtime.Result{}, ctx.Err()
	case tooLarge || len(out.out) > bounds.InvokeBody:
		return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.OutputTooLarge",
			Message: fmt.Sprintf("handler output exceeds %d bytes", bounds.InvokeBody)}
	case dead && !isClosed(c.done):
		return runtime.Result{}, runtimeExited()
	}
	if rc != 0 {
		return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.ExitError",
			Message:    fmt.Sprintf("handler exited with status %d", rc),
			StackTrace: c.stderr.String()}
	}
	outs, err := in.readOutputs("outputs." + n)
	if err != nil {
		return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.InvalidOutputs", Message: err.Error()}
	}
	return runtime.Result{Output: out.out, Outputs: outs}, nil
}

// trailerFoundLocked records that c's trailer was read. The child exits
// right after writing it, so the warm shell may have reported that exit
// already, ending c with the child's status: the trailer's, the function's,
// replaces it. Otherwise the exit, when it is reported, is known to be
// over. instance.mu is held.
func (in *instance) trailerFoundLocked(c *call, out *output) {
	if isClosed(c.done) {
		if !c.trailer {
			c.rc, c.trailer = out.rc, true
		}
		return
	}
	in.trailerPids[out.pid] = true
	c.finishLocked(out.rc, true)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// readOutputs reads the outputs file name in the scratch directory, if the
// handler wrote one. Most do not, and failing to open a name in the open
// directory costs a microsecond, a full path tens when cold. Only a regular
// file is read: a FIFO would block, a symlink could point anywhere.
func (in *instance) readOutputs(name string) (map[string]string, error) {
	fd, err := syscall.Openat(in.dirfd, name, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	switch {
	case err == syscall.ENOENT:
		return nil, nil
	case err == syscall.ELOOP:
		return nil, errors.New("outputs: $STOKE_OUTPUTS is a symbolic link")
	case err != nil:
		return nil, fmt.Errorf("outputs: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("outputs: $STOKE_OUTPUTS is not a regular file")
	}
	// The same bound as outputs.ReadFile: the total plus one '=' and one
	// newline per key.
	const max = bounds.OutputsTotal + 2*bounds.OutputKeys
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("outputs: %w", err)
	}
	if len(data) > max {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "outputs: more than %d bytes in all", bounds.OutputsTotal)
	}
	return outputs.Parse(data)
}

// slot holds the files of one request, made before the request comes so
// that this costs the request nothing: the request file, open for writing,
// and the stdout FIFO, open for reading and (the keeper) for writing.
type slot struct {
	dir    string
	seq    uint64
	req    *os.File
	out    *os.File
	keeper int // a write end of the FIFO of Go's own; -1 once closed
	err    error
}

func (s *slot) path(kind string) string {
	return filepath.Join(s.dir, kind+"."+strconv.FormatUint(s.seq, 10))
}

func (s *slot) closeKeeper() {
	if s.keeper >= 0 {
		_ = syscall.Close(s.keeper)
		s.keeper = -1
	}
}

// close releases the slot's files.
func (s *slot) close() {
	s.closeKeeper()
	for _, f := range []*os.File{s.req, s.out} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// reqPrefill is written to every request file ahead of time: writing a
// request over pages that exist costs a few microseconds, growing a new
// file tens. The child reads two NUL-terminated fields and stops, so the
// zeros after them are never seen.
var reqPrefill [4 << 10]byte

// prepare makes the slot of request seq in the background. Before that, it
// writes the sync marker that ends the stderr of prev's invocation c unless
// run did, and removes prev's files. Only one prepare is ever under way:
// Invoke takes the slot before it starts the next.
func (in *instance) prepare(seq uint64, prev *slot, c *call) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		if prev != nil {
			prev.close()
		}
		return
	}
	endLog := c != nil && c.endSync == 0
	in.prepWG.Add(1)
	go func() {
		defer in.prepWG.Done()
		if endLog {
			in.sync(in.stderrW, c, false)
		}
		if prev != nil {
			prev.close()
			for _, kind := range []string{"req", "out", "outputs"} {
				_ = os.Remove(prev.path(kind))
			}
		}
		s := &slot{dir: in.scratch, seq: seq, keeper: -1}
		s.req, s.err = os.OpenFile(s.path("req"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if s.err == nil {
			_, s.err = s.req.Write(reqPrefill[:])
		}
		if s.err == nil {
			s.out, s.keeper, s.err = openFIFO(s.path("out"))
		}
		in.slots <- s
	}()
}

// abort stops the invocation in flight early. It removes its request file
// reqPath, so that no child that reads its control line from now on can
// take it; reads the status pipe up to now, so that the child alive then
// is known (children announce themselves before they read a request); kills
// that child's process group; and waits until the warm shell has reported
// its end: the next child is forked after that, too late to take the
// request. A warm shell that does not report it within the grace period
// (stopped, or wedged) is killed: the instance is then Done and the core
// replaces it.
func (in *instance) abort(reqPath string) {
	_ = os.Remove(reqPath)
	ch, ok := in.sync(in.statusW, nil, true)
	if !ok { // the status pipe is wedged: the newest child known is the best guess
		in.mu.Lock()
		ch = in.cur
		in.mu.Unlock()
	}
	if ch == nil {
		return // between a child's end and the next fork
	}
	proc.KillGroup(ch.pid, 0, nil)
	// Its end is awaited even when c is over already (it took c and
	// finished): a child killed while it reads the control pipe can take
	// a byte of the next request's line with it, so that line is written
	// only once the child is gone.
	t := time.NewTimer(in.grace)
	defer t.Stop()
	select {
	case <-ch.done:
	case <-in.proc.Done(): // nobody will report it
	case <-t.C:
		in.proc.Kill(0)
	}
}

// openFIFO creates the FIFO at path and opens it for reading, without
// blocking, and for writing: the write end (a raw fd) keeps reads from
// seeing end-of-file before the child has opened the FIFO.
func openFIFO(path string) (r *os.File, keeper int, err error) {
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return nil, -1, err
	}
	r, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, err
	}
	keeper, err = syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		_ = r.Close()
		return nil, -1, err
	}
	return r, keeper, nil
}

// maxTrailer bounds the trailer "\x1e<nonce> done N PID STATUS\n" after
// the marker.
const maxTrailer = 80

// output collects one request's FIFO: the function's stdout and, after
// it, the trailer the child writes once the function has returned. It
// keeps at most bounds.InvokeBody bytes of output (and the trailer) and
// drops the rest, so that the writer never blocks.
type output struct {
	marker []byte // the trailer's start
	seq    uint64
	keep   int // the output may take the whole bound and the trailer follow it
	buf    []byte
	// next is where the search for the trailer resumes; discard is where
	// reads go once buf is full.
	next    int
	discard []byte

	out     []byte // the output, once the trailer or end-of-file was read
	trailer bool   // the trailer was read
	pid, rc int    // from the trailer: the child and the function's status
}

func newOutput(marker []byte, seq uint64) *output {
	return &output{marker: marker, seq: seq, keep: bounds.InvokeBody + len(marker) + maxTrailer,
		buf: make([]byte, 0, 512)}
}

// space is where the next read goes.
func (r *output) space() []byte {
	if r.over() {
		if r.discard == nil {
			r.discard = make([]byte, 64<<10)
		}
		return r.discard
	}
	if len(r.buf) == cap(r.buf) {
		r.buf = append(r.buf, 0)[:len(r.buf)]
	}
	return r.buf[len(r.buf):min(cap(r.buf), r.keep+1)]
}

func (r *output) took(n int) {
	if n > 0 && !r.over() {
		r.buf = r.buf[:len(r.buf)+n]
	}
}

// over reports that the output is known to pass the bound.
func (r *output) over() bool { return len(r.buf) > r.keep }

// findTrailer looks for a complete trailer line in what was read since the
// last call. Output after it (a background job's) is dropped.
func (r *output) findTrailer() bool {
	for {
		i := bytes.Index(r.buf[r.next:], r.marker)
		if i < 0 {
			// The marker may be cut by the end of this read.
			r.next = max(r.next, len(r.buf)-len(r.marker)+1)
			return false
		}
		i += r.next
		line := r.buf[i+len(r.marker):]
		end := bytes.IndexByte(line, '\n')
		if end < 0 {
			r.next = i // the line is not complete yet
			return false
		}
		f := strings.Fields(string(line[:end]))
		if len(f) != 4 || f[0] != "done" || f[1] != strconv.FormatUint(r.seq, 10) {
			// Not this request's trailer: only a handler that knows the
			// nonce can write that, so it is output.
			r.next = i + 1
			continue
		}
		r.pid, _ = strconv.Atoi(f[2])
		r.rc, _ = strconv.Atoi(f[3])
		r.out, r.trailer = r.buf[:i], true
		return true
	}
}

// tail keeps the last tailMax bytes of the lines added to it.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) add(line []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(append(t.b, line...), '\n')
	if len(t.b) > 2*tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Stderr is any bytes; the text goes into protobuf strings.
	s := strings.ToValidUTF8(string(bytes.TrimRight(t.b, "\n")), "\uFFFD")
	return bounds.TruncateHead(s, tailMax)
}
