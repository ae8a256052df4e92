package bash

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"stoke.dev/stoke/internal/proc"
)

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
		if w := in.waiting; w != nil {
			in.waiting = nil
			in.startPrepareLocked(w)
		}
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
