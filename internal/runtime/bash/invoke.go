package bash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime"
)

// runtimeExited is the error of an invocation whose warm shell died. It is
// new every time: the core sets the invocation ID in it.
func runtimeExited() error {
	return &errdefs.FunctionError{Type: errdefs.RuntimeExitError, Message: "the bash runtime exited during the invocation"}
}

// Invoke implements runtime.Instance.
func (in *instance) Invoke(ctx context.Context, inv runtime.Invocation) (runtime.Result, error) {
	if bytes.IndexByte(inv.Input, 0) >= 0 {
		// Valid JSON never has one; a bash variable cannot hold one.
		return runtime.Result{}, errdefs.InvalidArgument("input", "contains a NUL byte")
	}
	var s *slot
	var w *prepWork
	in.mu.Lock()
	if !in.closed {
		w, in.waiting = in.waiting, nil
	}
	in.mu.Unlock()
	if w != nil {
		// This request came before the next child was announced (calls
		// back to back): its files are made now, while that child forks.
		s = in.prepareNow(w)
	} else {
		select {
		case s = <-in.slots:
		case <-in.proc.Done():
			return runtime.Result{}, errdefs.Errorf(errdefs.ErrUnavailable, "bash runtime has exited")
		case <-ctx.Done():
			return runtime.Result{}, ctx.Err()
		}
	}
	if s.err != nil {
		in.prepare(s.seq+1, s, nil)
		return runtime.Result{}, fmt.Errorf("prepare request files: %w", s.err)
	}
	n := strconv.FormatUint(s.seq, 10)

	// The request file holds the ID, the payload and the invocation's
	// scope, each ending in a NUL; a bash variable cannot hold NUL, so the
	// ID loses any. It is written over the zeros prepare put there: see
	// reqPrefill.
	id := strings.ReplaceAll(inv.ID, "\x00", "")
	req := make([]byte, 0, len(id)+len(inv.Input)+len(inv.Scope)+3)
	req = append(append(req, id...), 0)
	req = append(append(req, inv.Input...), 0)
	req = append(append(req, inv.Scope...), 0)
	if _, err := s.req.WriteAt(req, 0); err != nil {
		in.prepare(s.seq+1, s, nil)
		return runtime.Result{}, fmt.Errorf("write request: %w", err)
	}

	c := &call{seq: s.seq, id: inv.ID, done: make(chan struct{})}
	in.mu.Lock()
	in.active = c
	in.logging = append(in.logging, c)
	in.mu.Unlock()
	res, err := in.run(ctx, c, s, n)
	in.mu.Lock()
	in.active = nil
	pid := c.pid
	in.mu.Unlock()
	// The next request gets fresh files, prepared (and this one's removed)
	// while nobody waits for it, and the end of this invocation's stderr is
	// marked: after an answer at the trailer, once the next child is
	// announced; otherwise (the child was killed or died) at once.
	if pid != 0 {
		in.deferPrepare(&prepWork{seq: s.seq + 1, prev: s, c: c}, pid)
	} else {
		in.prepare(s.seq+1, s, c)
	}
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
		return runtime.Result{}, &errdefs.FunctionError{Type: errdefs.RuntimeOutputTooLarge,
			Message: fmt.Sprintf("handler output exceeds %d bytes", bounds.InvokeBody)}
	case dead && !isClosed(c.done):
		return runtime.Result{}, runtimeExited()
	}
	if rc != 0 {
		return runtime.Result{}, &errdefs.FunctionError{Type: errdefs.RuntimeExitError,
			Message:    fmt.Sprintf("handler exited with status %d", rc),
			StackTrace: c.stderr.String()}
	}
	outs, err := outputs.ReadFileAt(in.dirfd, "outputs."+n)
	if err != nil {
		return runtime.Result{}, &errdefs.FunctionError{Type: errdefs.RuntimeInvalidOutputs, Message: err.Error()}
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
			c.rc, c.trailer, c.pid = out.rc, true, out.pid
		}
		return
	}
	in.trailerPids[out.pid] = true
	c.pid = out.pid
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
