package python

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runuser"
)

// A spare is a worker started ahead of its registration: the interpreter,
// `site` (the host's .pth files with it) and the worker's own imports done
// (it then says SPARE, kind 6, empty), idle on its request pipe. Load hands it the next registration whose
// start-up would have been the same — same user, same value of every
// variable read at start (readAtStart) but for the requirements directory
// on PYTHONPATH — with a handover frame on fd 3:
//
//	u32 len(payload) | payload
//	payload: { u32 len(s) | s }* of workdir, run_uid, handler, deps (the
//	         requirements directory, or ""), n (decimal), the n entries
//	         the spare was started with, then the registration's
//	         environment ("K=V" each)
//
// The worker answers HANDED (kind 5, empty) at once, before it runs
// anything of the registration's; then it takes the registration's
// environment (keeping what `site` changed in its own), moves to the
// working directory and goes on as a fresh worker does, from the
// handler's import. A spare that died, or that closes its pipes before
// HANDED, is never handed over: Load starts a worker as before.
//
// Requirements. A registration's own interpreter has its requirements
// directory leading PYTHONPATH; a spare is started with depsMark, a path
// that cannot exist, in that place, and the handover puts the directory
// there instead (or drops the mark): sys.path is the same, entry for
// entry. What else PYTHONPATH would have changed is the start-up itself:
// every import of the interpreter's start, `site`'s and its .pth files',
// looks in the directory first, and `site` imports sitecustomize from it.
// So the worker refuses (REFUSED, kind 7, why) a registration whose
// directory holds a top-level module or package named as one it has
// imported (sys.modules, the standard library's included), or
// sitecustomize or usercustomize; nothing of it taken, the spare waits
// for the next, and Load starts a worker of its own, as without a spare.
// .pth files in the directory are read by neither: `site` reads them in
// site directories only, never on PYTHONPATH. Not seen: a .pth file of
// the interpreter's own that tries an import and hides its failure, which
// the requirements could have answered at start.
//
// A spare runs in a process group of its own, as every worker does, which
// becomes the registration's; as the registration's user; in a scope of
// its own (runtime.Scopes), ended when the instance closes, so that what a
// handler forks without exec (which keeps the environment the spare was
// started with) is traced as it is for a fresh worker. Its output pipes
// are read from the handover on, under the registration: what `site`
// printed, which a fresh worker's registration logs, is filed there too.
// proc.Start gives it the server's death signal (SIGKILL), and CloseSpare
// kills it: it never outlives the Runtime Server.

// readAtStart reports whether the interpreter, `site` or the worker's own
// imports read environment variable k before the handover: every PYTHON*
// variable (PYTHONPATH, a requirements directory included), the locale
// (LANG, LC_*: the file system and stdio encodings), TZ (the time module's
// zone at its import), and PATH when the interpreter is not an absolute
// path (it is found, and its prefix computed, through it).
func (a *Adapter) readAtStart(k string) bool {
	return strings.HasPrefix(k, "PYTHON") || k == "LANG" || strings.HasPrefix(k, "LC_") || k == "TZ" ||
		(k == "PATH" && !strings.HasPrefix(a.interpreter, "/"))
}

// startEnv returns the entries of env read at start, sorted.
func (a *Adapter) startEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); a.readAtStart(k) {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// spare is a started spare worker.
type spare struct {
	*worker
	user  *runuser.User
	env   []string // what it was started with, its scope's entry included
	start []string // startEnv(env)
	// endScope ends the spare's scope; once, when the instance it became
	// closes, or when it is killed unused.
	endScope func()

	// Set while it starts (spares.pending): readyc is closed, under
	// spares.mu, when its start-up ended, readyErr saying how; claimed
	// means a registration waits for it, and then owns it once readyc
	// is closed.
	readyc   chan struct{}
	readyErr error
	claimed  bool
}

func (s *spare) fits(user *runuser.User, start []string) bool {
	return s.user == user && slices.Equal(s.start, start)
}

// kill ends a spare that was not handed over.
func (s *spare) kill() {
	s.p.Kill(0)
	s.closeFiles()
	s.endScope()
}

// depsMark leads a spare's PYTHONPATH, in the place of a registration's
// requirements directory; worker.py's DEPS_MARK is the same. /dev/null is
// no directory, so nothing is ever found there.
const depsMark = "/dev/null/stoke-requirements"

// maxRefusal bounds a REFUSED frame's reason; the worker cuts it to 1024
// characters.
const maxRefusal = 4 << 10

// remakeAfter is how long after a handover the next spare is made at the
// latest, if the instance has not been invoked by then (a var for tests):
// longer than a quiet first answer takes, shorter than registrations that
// follow each other (a benchmark's, a scale up's) are apart.
var remakeAfter = 100 * time.Millisecond

// answerLead is how long after a handed-over worker's first invocation
// returned the next spare is made (a var for tests). The answer's way out
// (the Runtime Server's reply, runtimed's hop, the gateway, the client:
// a scale from zero's first answer) takes a few milliseconds of CPU on
// the same cores, which the next interpreter's start would otherwise
// share and hold back (docs/benchmarks.md, "Scale from zero on
// Kubernetes: traced in each process").
var answerLead = 25 * time.Millisecond

// spareWait bounds how long a registration waits for a spare that fits
// but is still starting (spares.take); a var for tests.
var spareWait = time.Second

// spares keeps at most one spare, made again after each handover.
type spares struct {
	a   *Adapter
	seq atomic.Uint64 // numbers the spares' scopes

	mu      sync.Mutex
	spec    *runtime.SpareSpec // nil: none kept (KeepSpare not called)
	cur     *spare             // ready, waiting for a registration
	making  bool
	pending *spare // started, not yet ready
	closed  bool
	timer   *time.Timer    // makeSoon's
	wg      sync.WaitGroup // the making goroutine
	// started and made, if set (by tests), are called with each spare
	// started, and each ready and kept.
	started, made func(pid int)
}

// KeepSpare starts keeping a spare worker for registrations like spec
// (runtime.SpareKeeper); only with Config.Spare.
func (a *Adapter) KeepSpare(spec runtime.SpareSpec) {
	if !a.spareOn {
		return
	}
	a.spares.mu.Lock()
	if a.spares.spec == nil && !a.spares.closed {
		spec.Env = slices.Clone(spec.Env)
		a.spares.spec = &spec
	}
	a.spares.mu.Unlock()
	a.spares.make()
}

// CloseSpare kills the spare and makes no more (runtime.SpareKeeper).
func (a *Adapter) CloseSpare() {
	a.spares.mu.Lock()
	a.spares.closed = true
	if a.spares.timer != nil {
		a.spares.timer.Stop() // and make, if it runs, sees closed
	}
	s, pending := a.spares.cur, a.spares.pending
	a.spares.cur = nil
	a.spares.mu.Unlock()
	if pending != nil {
		pending.p.Kill(0) // its maker sees EOF and cleans up
	}
	a.spares.wg.Wait()
	if s != nil {
		s.kill()
	}
}

// makeSoon arms make for remakeAfter from now and returns a function
// that re-arms it for answerLead from then (called once the first
// invocation has returned: its answer is still on its way out);
// CloseSpare disarms it.
func (ss *spares) makeSoon() func() {
	t := time.AfterFunc(remakeAfter, ss.make)
	ss.mu.Lock()
	if ss.timer != nil {
		ss.timer.Stop()
	}
	ss.timer = t
	ss.mu.Unlock()
	return func() {
		// Fired already (no invocation within remakeAfter): make runs
		// again, and does nothing while there is a spare or one is made.
		t.Reset(answerLead)
	}
}

// make starts a spare in the background unless there is one, one is being
// made, or none is kept.
func (ss *spares) make() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.spec == nil || ss.closed || ss.cur != nil || ss.making {
		return
	}
	ss.making = true
	spec := ss.spec
	ss.wg.Add(1)
	go func() {
		defer ss.wg.Done()
		log := logging.OrDiscard(spec.Logger)
		s, err := ss.start(spec)
		if err == nil {
			ss.mu.Lock()
			if ss.closed {
				ss.mu.Unlock()
				s.kill()
				return
			}
			ss.pending = s
			started := ss.started
			ss.mu.Unlock()
			if started != nil {
				started(s.p.Pid())
			}
			err = s.awaitReady()
		}
		ss.mu.Lock()
		ss.making, ss.pending = false, nil
		if s != nil {
			s.readyErr = err
			close(s.readyc)
			if s.claimed { // the registration waiting for it owns it
				ss.mu.Unlock()
				return
			}
		}
		switch {
		case err != nil:
			closed := ss.closed // then CloseSpare killed it: no news
			ss.mu.Unlock()
			if s != nil {
				s.kill()
			}
			if !closed {
				log.Warn("no spare python worker", "error", err)
			}
		case ss.closed:
			ss.mu.Unlock()
			s.kill()
		default:
			ss.cur = s
			made := ss.made
			ss.mu.Unlock()
			if made != nil {
				made(s.p.Pid())
			}
		}
	}()
}

// start starts one spare worker for spec.
func (ss *spares) start(spec *runtime.SpareSpec) (*spare, error) {
	a := ss.a
	env := spec.Env
	endScope := func() {}
	if sc := spec.Scopes; sc != nil {
		scope := "python-spare-" + strconv.FormatUint(ss.seq.Add(1), 10)
		env = append(slices.Clip(env), proc.ScopeEnv+"="+scope)
		sc.Begin(scope)
		var once sync.Once
		endScope = func() { once.Do(func() { sc.End(scope) }) }
	}
	// "/": a directory every user may enter, of no Run; the handover
	// moves it to the registration's.
	start := a.startEnv(env) // what a registration's is compared with
	env = pathFirst(env, depsMark)
	w, err := a.startWorker("/", env, spec.User, "")
	if err != nil {
		endScope()
		return nil, err
	}
	return &spare{worker: w, user: spec.User, env: env, start: start, endScope: endScope, readyc: make(chan struct{})}, nil
}

// awaitReady waits for the spare's SPARE frame, sent once its start-up is
// done and it waits for its registration. One that never sends it (stuck
// writing more than a pipe holds before its output is read, or killed by
// CloseSpare) is never handed over.
func (s *spare) awaitReady() error {
	var h [respHeaderSize]byte
	if _, err := io.ReadFull(s.resp, h[:]); err != nil {
		select {
		case <-s.p.Done():
			return fmt.Errorf("the spare python worker exited at its start (%v); a registration starts its own", s.p.Err())
		default:
			return fmt.Errorf("the spare python worker: %w", err)
		}
	}
	if h[4] != kindSpare || binary.LittleEndian.Uint32(h[:4]) != 0 {
		return &protocolError{fmt.Sprintf("response kind %d from a spare", h[4])}
	}
	return nil
}

// take returns the spare if it can serve a registration as user whose
// start-up environment is start, and it is alive; nil otherwise (a spare
// that does not fit is kept for the next one). A spare that fits but is
// still starting is waited for, at most spareWait or until ctx ends: the
// rest of its start is shorter than a whole one, which would also share
// the CPUs with it. One not ready by then is left to be the next one's.
func (ss *spares) take(ctx context.Context, user *runuser.User, start []string) *spare {
	ss.mu.Lock()
	if s := ss.cur; s != nil && s.fits(user, start) {
		ss.cur = nil
		ss.mu.Unlock()
		return alive(s)
	}
	s := ss.pending
	if s == nil || s.claimed || !s.fits(user, start) {
		ss.mu.Unlock()
		return nil
	}
	s.claimed = true
	ss.mu.Unlock()
	t := time.NewTimer(spareWait)
	defer t.Stop()
	select {
	case <-s.readyc:
	case <-t.C:
	case <-ctx.Done():
	}
	ss.mu.Lock()
	select {
	case <-s.readyc: // its start ended: it is this registration's
		ss.mu.Unlock()
		if s.readyErr != nil {
			s.kill() // Load's deferred make starts another
			return nil
		}
		return alive(s)
	default:
		s.claimed = false // its maker keeps it
		ss.mu.Unlock()
		return nil
	}
}

// alive returns s, or nil (killing what is left of it) if it has exited.
func alive(s *spare) *spare {
	select {
	case <-s.p.Done():
		s.kill()
		return nil
	default:
		return s
	}
}

// putBack keeps s, which refused a registration and took nothing of it,
// as the spare, unless one is there or being made, or none is kept: then
// s is killed.
func (ss *spares) putBack(s *spare) {
	ss.mu.Lock()
	if ss.spec == nil || ss.closed || ss.cur != nil || ss.making {
		ss.mu.Unlock()
		s.kill()
		return
	}
	ss.cur = s
	ss.mu.Unlock()
}

// handOver gives the spare s the registration spec with env and its
// requirements directory deps (""). handed is false if s turned out dead
// or broken before it took it (then s is gone), or refused it (then s is
// the spare again): the caller starts a worker as it would have; nothing
// of the registration ran.
func (a *Adapter) handOver(ctx context.Context, s *spare, spec runtime.FunctionSpec, env []string, deps string, releaseDeps func()) (_ runtime.Instance, handed bool, _ error) {
	log := logging.OrDiscard(spec.Logger)
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, 0) // the payload's length, below
	add := func(v string) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	add(spec.WorkingDir)
	add(spec.RunUID)
	add(spec.Handler)
	add(deps)
	add(strconv.Itoa(len(s.env)))
	for _, kv := range s.env {
		add(kv)
	}
	for _, kv := range env {
		add(kv)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)-4))

	interrupt := func() {
		past := time.Unix(1, 0)
		_ = s.resp.SetReadDeadline(past)
		_ = s.req.SetWriteDeadline(past)
	}
	stop := context.AfterFunc(ctx, interrupt)
	var ack [respHeaderSize]byte
	var why []byte
	_, err := s.req.Write(b)
	if err == nil {
		_, err = io.ReadFull(s.resp, ack[:])
	}
	n := binary.LittleEndian.Uint32(ack[:4])
	if err == nil && ack[4] == kindRefused && n <= maxRefusal {
		why = make([]byte, n)
		_, err = io.ReadFull(s.resp, why)
	}
	if !stop() {
		s.kill()
		releaseDeps()
		return nil, true, fmt.Errorf("python worker did not become ready: %w", ctx.Err())
	}
	switch {
	case err == nil && why != nil:
		log.Debug("the spare python worker cannot take this registration; starting one", "reason", string(why))
		a.spares.putBack(s) // stop() held: no deadline was set
		return nil, false, nil
	case err != nil || ack[4] != kindHanded || n != 0:
		log.Debug("the spare python worker could not be handed over; starting one", "pid", s.p.Pid())
		s.kill()
		return nil, false, nil
	}
	end := s.endScope
	release := func() { releaseDeps(); end() }
	i, err := a.ready(ctx, log, spec, s.worker, release)
	return i, true, err
}
