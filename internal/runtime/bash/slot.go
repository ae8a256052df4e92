package bash

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

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

// prepWork is the making of request seq's slot: before it, the end of
// invocation c's stderr is marked unless run did, and the files of prev (c's
// slot) are removed. Both may be nil.
type prepWork struct {
	seq  uint64
	prev *slot
	c    *call
}

// prepare makes the slot of request seq in the background, after the work
// on prev and c of prepWork. Only one prepare is ever under way: Invoke
// takes the slot before it starts the next.
func (in *instance) prepare(seq uint64, prev *slot, c *call) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.startPrepareLocked(&prepWork{seq: seq, prev: prev, c: c})
}

// deferPrepare prepares w once the warm shell has announced the child after
// pid, whose trailer answered w.c. Right after an answer that child's exit,
// its reaping and the next fork keep the machine busy, and the tens of
// microseconds of file work here would hold back the reply on a small
// machine (docs/benchmarks.md, "Bash, paced"); by the announcement, the
// reply has left. A request that comes first takes w and does it itself.
func (in *instance) deferPrepare(w *prepWork, pid int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if cur := in.cur; in.closed || cur != nil && cur.pid != pid {
		in.startPrepareLocked(w) // announced already (or closing)
		return
	}
	in.waiting = w
}

// startPrepareLocked runs w in the background and hands its slot to the
// next Invoke. instance.mu is held.
func (in *instance) startPrepareLocked(w *prepWork) {
	if in.closed {
		if w.prev != nil {
			w.prev.close()
		}
		return
	}
	in.prepWG.Add(1)
	go func() {
		defer in.prepWG.Done()
		in.slots <- in.prepareNow(w)
	}()
}

// prepareNow does w and returns the new slot, with its error if the files
// could not be made.
func (in *instance) prepareNow(w *prepWork) *slot {
	in.mu.Lock()
	endLog := w.c != nil && w.c.endSync == 0
	in.mu.Unlock()
	if endLog {
		in.sync(in.stderrW, w.c, false)
	}
	if prev := w.prev; prev != nil {
		prev.close()
		for _, kind := range []string{"req", "out", "outputs"} {
			_ = os.Remove(prev.path(kind))
		}
	}
	s := &slot{dir: in.scratch, seq: w.seq, keeper: -1}
	s.req, s.err = os.OpenFile(s.path("req"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if s.err == nil {
		_, s.err = s.req.Write(reqPrefill[:])
	}
	if s.err == nil {
		s.out, s.keeper, s.err = openFIFO(s.path("out"))
	}
	// The child reads the one and writes the other as the Runs' user.
	if s.err == nil {
		s.err = errors.Join(in.user.GiveFile(s.req), in.user.GiveFile(s.out))
	}
	return s
}

// openFIFO creates the FIFO at path and opens it for reading, without
// blocking, and for writing: the write end (a raw fd) keeps reads from
// seeing end-of-file before the child has opened the FIFO.
//
// The directory may be the Runs' user's (runuser), who could put
// something else under the name between the mkfifo and the opens: neither
// open follows a symbolic link, and both must be the FIFO just made, so
// that a server running as root never reads (and returns as the output) a
// file the user could not read itself.
func openFIFO(path string) (r *os.File, keeper int, err error) {
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return nil, -1, err
	}
	r, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, -1, err
	}
	keeper, err = syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		_ = r.Close()
		return nil, -1, err
	}
	var rs, ks syscall.Stat_t
	if err := errors.Join(syscall.Fstat(int(r.Fd()), &rs), syscall.Fstat(keeper, &ks)); err != nil ||
		rs.Mode&syscall.S_IFMT != syscall.S_IFIFO || rs.Dev != ks.Dev || rs.Ino != ks.Ino {
		_ = r.Close()
		_ = syscall.Close(keeper)
		return nil, -1, fmt.Errorf("%s is not the FIFO made for the request (%v)", path, err)
	}
	return r, keeper, nil
}
