package bash

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	log    *slog.Logger // spec.Logger
	grace  time.Duration
	proc   *proc.Process
	marker []byte   // "\x1e<nonce> ": prefix of the stderr markers
	ctl    *os.File // control pipe, write end: one request number per request
	status *os.File // status pipe, read end
	stderr *os.File // stderr of the warm shell and every child, read end
	// statusW and stderrW are write ends of Go's own, for the sync lines
	// that tell when a reader has read everything written before them.
	statusW *os.File
	stderrW *os.File
	// scratch is this instance's own directory inside spec.ScratchDir (a
	// replacement instance gets another), holding req.N, out.N and
	// outputs.N; root is it opened, for lookups that do not walk the path.
	scratch string
	root    *os.Root

	// The status reader and the stderr pump stop at end-of-file, which
	// Close forces after a grace period.
	statusDone chan struct{}
	pumpDone   chan struct{}

	initDone chan struct{} // closed by the status reader at "ready" or "init …"
	initMsg  string        // valid once initDone is closed
	initTail tail          // stderr outside invocations

	mu     sync.Mutex
	cur    *child // the newest child announced that has not ended
	active *call  // the invocation in flight
	// markerPids are the children whose "done" marker was read: their
	// exits belong to invocations that are already over.
	markerPids map[int]bool
	syncs      map[uint64]chan struct{} // sync lines written and not yet read back
	syncSeq    uint64
	closed     bool // no more prepare goroutines

	slots     chan *slot     // the next request's FIFO; capacity 1
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
	rd     *outReader
	stderr tail // bounded tail of its stderr

	// done is closed (under instance.mu) when the result is known: at the
	// child's "done" marker, or at the exit of the child that took the
	// request when it wrote none (exit, set -e, a signal).
	done   chan struct{}
	rc     int
	marker bool // done came from the marker: all its stderr has been read
}

// finishLocked records c's exit status once; instance.mu is held.
func (c *call) finishLocked(rc int, marker bool) {
	select {
	case <-c.done:
	default:
		c.rc, c.marker = rc, marker
		close(c.done)
	}
}

// start starts the warm shell and its two reader goroutines.
func start(a *Adapter, spec runtime.FunctionSpec, path, fn, nonce string) (in *instance, err error) {
	scratch := filepath.Join(spec.ScratchDir, "bash-"+nonce)
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(scratch)
	if err != nil {
		_ = os.RemoveAll(scratch)
		return nil, err
	}
	var files []*os.File // closed on failure
	defer func() {
		if err != nil {
			closeAll(files...)
			_ = root.Close()
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
	ctlR.Close() // the warm shell holds its own copy
	in = &instance{
		log: spec.Logger, grace: a.grace, proc: p,
		marker:     []byte("\x1e" + nonce + " "),
		ctl:        ctlW,
		status:     statusR,
		stderr:     stderrR,
		statusW:    statusW,
		stderrW:    stderrW,
		scratch:    scratch,
		root:       root,
		statusDone: make(chan struct{}),
		pumpDone:   make(chan struct{}),
		initDone:   make(chan struct{}),
		markerPids: map[int]bool{},
		syncs:      map[uint64]chan struct{}{},
		slots:      make(chan *slot, 1),
	}
	go in.readStatus()
	go in.pumpStderr()
	in.prepare(nil, 1, false)
	return in, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// readStatus follows the status pipe until every writer (the warm shell
// and its idle child) is gone.
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
		if c := in.cur; c != nil && c.pid == n {
			in.cur = nil
			close(c.done)
		}
		switch a := in.active; {
		case in.markerPids[n]:
			// Its invocation ended at the marker.
			delete(in.markerPids, n)
		case f[3] == "1":
			// It died before it read the request line, which the next
			// child will take. (abort kills idle children too.)
			in.log.Debug("bash runtime: idle child ended", "pid", n, "status", rc)
		case a != nil:
			// Children take requests one at a time, and the exits of
			// those that took earlier ones have been read (or are in
			// markerPids): this one took a's.
			a.finishLocked(rc, false)
		default:
			in.log.Debug("bash runtime: idle child ended", "pid", n, "status", rc)
		}
	case f[0] == "sync":
		in.syncedLocked(uint64(n))
	default:
		in.log.Warn("bash runtime: unexpected status line", "line", line)
	}
}

// pumpStderr logs stderr line by line, with the invocation in flight (if
// any), and acts on the markers.
func (in *instance) pumpStderr() {
	defer close(in.pumpDone)
	loglines.Pump(in.stderr, func(line []byte) {
		if len(line) == 0 {
			// Each marker starts with a newline to end a partial line,
			// which leaves blank lines that carry nothing.
			return
		}
		// A marker starts with a newline of its own, but a background job
		// writing at the same moment can still precede it on its line.
		if i := bytes.Index(line, in.marker); i >= 0 {
			in.handleMarker(string(line[i+len(in.marker):]))
			if line = line[:i]; len(line) == 0 {
				return
			}
		}
		in.mu.Lock()
		a := in.active
		in.mu.Unlock()
		log := in.log
		if a != nil {
			log = a.log
			a.stderr.add(line)
		} else {
			in.initTail.add(line)
		}
		log.Info("stderr", "line", string(line))
	})
}

// handleMarker acts on "done N PID STATUS" (the function of request N has
// returned) and "sync K" (written by sync).
func (in *instance) handleMarker(m string) {
	f := strings.Fields(m)
	if len(f) < 2 {
		return
	}
	n, _ := strconv.ParseUint(f[1], 10, 64)
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case f[0] == "done" && len(f) == 4:
		pid, _ := strconv.Atoi(f[2])
		rc, _ := strconv.Atoi(f[3])
		if a := in.active; a != nil && a.seq == n {
			// The child exits once released, after this: its exit line
			// takes the entry out again.
			in.markerPids[pid] = true
			a.finishLocked(rc, true)
			// Start the reader's last read now, not once Invoke runs.
			a.rd.finish()
		}
	case f[0] == "sync":
		in.syncedLocked(n)
	}
}

// syncedLocked wakes the waiter of sync line k; instance.mu is held.
func (in *instance) syncedLocked(k uint64) {
	if ch := in.syncs[k]; ch != nil {
		close(ch)
		delete(in.syncs, k)
	}
}

// sync returns once the reader of w's pipe has read everything written to
// it before the call (or after the grace period): a sync line of Go's own
// queues behind it. On stderr the line is a marker.
func (in *instance) sync(w *os.File) {
	in.mu.Lock()
	in.syncSeq++
	k := in.syncSeq
	ch := make(chan struct{})
	in.syncs[k] = ch
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		delete(in.syncs, k)
		in.mu.Unlock()
	}()
	line := fmt.Sprintf("sync %d\n", k)
	if w == in.stderrW {
		line = "\n" + string(in.marker) + line
	}
	deadline := time.Now().Add(in.grace)
	_ = w.SetWriteDeadline(deadline)
	if _, err := w.WriteString(line); err != nil {
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-in.pumpDone:
	case <-in.statusDone:
	}
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
		// kill) reads end-of-file here and exits.
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
		in.prepWG.Wait()
		select {
		case s := <-in.slots:
			s.close()
		default:
		}
		_ = in.root.Close()
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
	n := strconv.FormatUint(s.seq, 10)
	c := &call{seq: s.seq, log: log, rd: s.rd, done: make(chan struct{})}
	// Whatever happens, the next request gets fresh files, prepared (and
	// this one's removed) while nobody waits for it.
	defer func() {
		in.mu.Lock()
		release := c.marker
		in.mu.Unlock()
		in.prepare(s, s.seq+1, release)
	}()
	if s.err != nil {
		return runtime.Result{}, fmt.Errorf("prepare request files: %w", s.err)
	}

	// The request file holds the ID and the payload, each ending in a NUL;
	// a bash variable cannot hold NUL, so the ID loses any. It is written
	// over the zeros prepare put there: see reqPrefill.
	id := strings.ReplaceAll(inv.ID, "\x00", "")
	req := make([]byte, 0, len(id)+len(inv.Input)+2)
	req = append(append(req, id...), 0)
	req = append(append(req, inv.Input...), 0)
	if _, err := s.req.WriteAt(req, 0); err != nil {
		return runtime.Result{}, fmt.Errorf("write request: %w", err)
	}

	rd := s.rd
	defer in.awaitReader(rd)
	defer s.closeKeeper()

	in.mu.Lock()
	in.active = c
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		in.active = nil
		in.mu.Unlock()
	}()

	if _, err := in.ctl.Write([]byte(n + "\n")); err != nil {
		return runtime.Result{}, fmt.Errorf("send request: %w", err)
	}

	var tooLarge, dead bool
	select {
	case <-c.done:
	case <-rd.tooLarge:
		tooLarge = true
		in.abort(c, s.reqPath())
	case <-ctx.Done():
		in.abort(c, s.reqPath())
	case <-in.proc.Done():
		dead = true
		in.abort(c, s.reqPath())
	}
	// The function has returned, or its child has ended (or is gone with
	// the warm shell). After the marker the reader takes what is in the
	// FIFO; otherwise it reads until every writer is gone.
	in.mu.Lock()
	viaMarker := c.marker
	in.mu.Unlock()
	s.closeKeeper()
	in.awaitReader(rd)
	if !viaMarker {
		// Neither the child's stderr nor its exit travel with the marker:
		// wait until the pump has read what was written before the exit,
		// so that this call's lines are logged as its own and its tail is
		// complete.
		in.sync(in.stderrW)
	}

	switch {
	case ctx.Err() != nil:
		return runtime.Result{}, ctx.Err()
	case tooLarge || len(rd.buf) > bounds.InvokeBody:
		return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.OutputTooLarge",
			Message: fmt.Sprintf("handler output exceeds %d bytes", bounds.InvokeBody)}
	case dead:
		return runtime.Result{}, runtimeExited()
	}
	select {
	case <-c.done:
	default:
		return runtime.Result{}, runtimeExited()
	}
	in.mu.Lock()
	rc := c.rc
	in.mu.Unlock()
	if rc != 0 {
		return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.ExitError",
			Message:    fmt.Sprintf("handler exited with status %d", rc),
			StackTrace: c.stderr.String()}
	}
	// Most handlers write no outputs; looking the file up in the open
	// directory is much cheaper than failing to open it by its path.
	var outs map[string]string
	if _, err := in.root.Lstat("outputs." + n); err == nil {
		if outs, err = outputs.ReadFile(filepath.Join(in.scratch, "outputs."+n)); err != nil {
			return runtime.Result{}, &errdefs.FunctionError{Type: "Runtime.InvalidOutputs", Message: err.Error()}
		}
	}
	return runtime.Result{Output: rd.buf, Outputs: outs}, nil
}

// slot holds the files of one request, made before the request comes so
// that this costs the request nothing: the request file, open for writing,
// and the stdout FIFO with its reader already running.
type slot struct {
	dir    string
	seq    uint64
	req    *os.File
	rd     *outReader
	keeper int // a write end of the FIFO of Go's own; -1 once closed
	err    error
}

func (s *slot) path(kind string) string {
	return filepath.Join(s.dir, kind+"."+strconv.FormatUint(s.seq, 10))
}

func (s *slot) reqPath() string { return s.path("req") }

func (s *slot) closeKeeper() {
	if s.keeper >= 0 {
		_ = syscall.Close(s.keeper)
		s.keeper = -1
	}
}

// close releases the slot's files and stops its reader.
func (s *slot) close() {
	s.closeKeeper()
	if s.req != nil {
		_ = s.req.Close()
	}
	if s.rd != nil {
		_ = s.rd.f.Close()
		<-s.rd.done
	}
}

// reqPrefill is written to every request file ahead of time: writing a
// request over pages that exist costs a few microseconds, growing a new
// file tens. The child reads two NUL-terminated fields and stops, so the
// zeros after them are never seen.
var reqPrefill [4 << 10]byte

// prepare makes the slot of request seq in the background. Before that it
// releases the child that answered the previous request through its marker
// (it waits for this line before it exits; a stray one is skipped as a
// request, there being no file req.r) and removes the previous request's
// files. Only one prepare is ever under way: Invoke takes the slot before
// it starts the next.
func (in *instance) prepare(prev *slot, seq uint64, release bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		if prev != nil {
			prev.close()
		}
		return
	}
	in.prepWG.Add(1)
	go func() {
		defer in.prepWG.Done()
		if release {
			_, _ = in.ctl.Write([]byte("r\n"))
		}
		if prev != nil {
			prev.close()
			for _, kind := range []string{"req", "out", "outputs"} {
				_ = os.Remove(prev.path(kind))
			}
		}
		s := &slot{dir: in.scratch, seq: seq, keeper: -1}
		s.req, s.err = os.OpenFile(s.reqPath(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if s.err == nil {
			_, s.err = s.req.Write(reqPrefill[:])
		}
		if s.err == nil {
			var r *os.File
			r, s.keeper, s.err = openFIFO(s.path("out"))
			if s.err == nil {
				s.rd = newOutReader(r)
				go s.rd.run()
			}
		}
		in.slots <- s
	}()
}

// abort stops invocation c early. It removes c's request file, so that no
// child that reads c's control line from now on can take it; reads the
// status pipe up to now, so that the child alive then is known (children
// announce themselves before they read a request); kills that child's
// process group; and waits until the warm shell has reported its end: the
// next child is forked after that, too late to take c. A warm shell that
// does not report it within the grace period (stopped, or wedged) is
// killed: the instance is then Done and the core replaces it.
func (in *instance) abort(c *call, reqPath string) {
	_ = os.Remove(reqPath)
	in.sync(in.statusW)
	in.mu.Lock()
	ch := in.cur
	in.mu.Unlock()
	if ch == nil {
		return // between a child's end and the next fork
	}
	proc.KillGroup(ch.pid, 0, nil)
	t := time.NewTimer(in.grace)
	defer t.Stop()
	select {
	case <-ch.done:
	case <-c.done:
	case <-in.proc.Done(): // nobody will report it
	case <-t.C:
		in.proc.Kill(0)
	}
}

// awaitReader waits for the stdout reader to stop, which can only be late
// if a process that left the child's group holds the FIFO.
func (in *instance) awaitReader(rd *outReader) {
	select {
	case <-rd.done:
		return
	default:
	}
	t := time.NewTimer(in.grace)
	defer t.Stop()
	select {
	case <-rd.done:
	case <-t.C:
		in.log.Warn("bash runtime: handler stdout still open after the handler ended")
		_ = rd.f.Close()
		<-rd.done
	}
}

// openFIFO creates the FIFO at path and opens it for reading, without
// blocking, and for writing: the write end (a raw fd) keeps the reader from
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

// outReader reads a handler's stdout until end-of-file, keeping at most
// limit+1 bytes and discarding the rest so that the writer never blocks.
type outReader struct {
	f        *os.File
	limit    int
	buf      []byte
	discard  []byte
	tooLarge chan struct{} // closed once more than limit bytes arrived
	done     chan struct{} // closed when the reader stopped; buf is then final
	// finishing makes the reader stop at the first empty read instead of at
	// end-of-file: see finish.
	finishing atomic.Bool
}

func newOutReader(f *os.File) *outReader {
	return &outReader{f: f, limit: bounds.InvokeBody, buf: make([]byte, 0, 512),
		tooLarge: make(chan struct{}), done: make(chan struct{})}
}

func (r *outReader) run() {
	defer r.f.Close() // after done: nobody waits for it
	defer close(r.done)
	for {
		n, err := r.f.Read(r.space())
		r.took(n)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && r.finishing.Load() {
				r.drain()
			}
			return
		}
	}
}

// finish stops the reader once the pipe is empty. The function has
// returned by then, so all it wrote is in the pipe; a background job that
// still holds its stdout must not hold up the answer.
func (r *outReader) finish() {
	r.finishing.Store(true)
	_ = r.f.SetReadDeadline(time.Now())
}

// drain reads what is left in the pipe without waiting for more. A read
// that hit the deadline may have raced with the last write, so this reads
// once more, not trusting the poller.
func (r *outReader) drain() {
	_ = r.f.SetReadDeadline(time.Time{})
	rc, err := r.f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.Read(int(fd), r.space())
			if n > 0 {
				r.took(n)
				continue
			}
			if err == syscall.EINTR {
				continue
			}
			return true // empty (EAGAIN), end-of-file or an error
		}
	})
}

// space is where the next read goes: buf while it is within the bound,
// then a scratch buffer whose contents are dropped.
func (r *outReader) space() []byte {
	if len(r.buf) <= r.limit {
		if len(r.buf) == cap(r.buf) {
			r.buf = append(r.buf, 0)[:len(r.buf)]
		}
		return r.buf[len(r.buf):min(cap(r.buf), r.limit+1)]
	}
	if r.discard == nil {
		r.discard = make([]byte, 64<<10)
	}
	return r.discard
}

func (r *outReader) took(n int) {
	if n <= 0 || len(r.buf) > r.limit {
		return
	}
	r.buf = r.buf[:len(r.buf)+n]
	if len(r.buf) > r.limit {
		close(r.tooLarge)
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
