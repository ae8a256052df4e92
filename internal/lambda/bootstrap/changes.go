package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	"stoke.dev/stoke/internal/bounds"
)

// What a write-back task changed: the bootstrap records every entry of
// the task's directory as the copy of the package left it, and when the
// task ends compares the directory with that record, so that the Runtime
// Server copies back only the new and changed entries and deletes what
// the task removed (agentv1.TaskEnded).
//
// An entry changed when its type, size, permission bits, modification
// time, change time or inode differ from the record. The change time
// cannot be set by a program (a `touch -d` sets the modification time and
// moves the change time to now), but the file system's clock is coarse
// (a few milliseconds): a file the task rewrote within the tick of its
// copy, at the same size, could show the same times. As git does for its
// index ("racy git"), an entry recorded at or after the tick of a probe
// made when the copy ended is compared by content with the package's
// read-only original instead.

// state is what the record keeps of one entry.
type state struct {
	mode         fs.FileMode // type and permission bits
	size         int64
	mtime, ctime syscall.Timespec
	ino          uint64
}

func stateOf(fi fs.FileInfo) state {
	st := state{mode: fi.Mode(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.mtime, st.ctime, st.ino = sys.Mtim, sys.Ctim, sys.Ino
	}
	return st
}

func (a state) same(b state) bool {
	return a.mode == b.mode && a.size == b.size && a.mtime == b.mtime && a.ctime == b.ctime && a.ino == b.ino
}

func notBefore(a, b syscall.Timespec) bool {
	return a.Sec > b.Sec || a.Sec == b.Sec && a.Nsec >= b.Nsec
}

// record is the directory of a write-back task as its copy left it.
type record struct {
	src     string           // the package, the originals
	entries map[string]state // by slash-separated name relative to the directory
	tick    syscall.Timespec // the probe's change time, taken after the copy
}

// add records the entry at rel, whose copy is at target.
func (r *record) add(rel, target string) error {
	fi, err := os.Lstat(target)
	if err != nil {
		return err
	}
	r.entries[filepath.ToSlash(rel)] = stateOf(fi)
	return nil
}

// seal takes the tick, from probe (a file made now, outside the
// directory).
func (r *record) seal(probe string) error {
	fi, err := os.Lstat(probe)
	if err != nil {
		return err
	}
	r.tick = stateOf(fi).ctime
	return nil
}

// changes compares dir with the record: the entries to copy back (new or
// changed, a directory before its entries) and the names removed (a
// removed directory alone, sorted; a name whose type changed is in both),
// with the count of entries left unchanged. It consumes the record.
func (r *record) changes(dir string) (send, deleted []string, unchanged int64, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		now := stateOf(fi)
		was, ok := r.entries[rel]
		delete(r.entries, rel)
		switch {
		case !ok:
			send = append(send, rel)
		case was.mode.Type() != now.mode.Type():
			deleted = append(deleted, rel)
			send = append(send, rel)
		case now.mode.IsDir():
			// A directory's own times change with its entries, and only
			// its entries are compared; its permission bits are not
			// written back (artifact.Extract).
			unchanged++
		case !was.same(now):
			send = append(send, rel)
		case notBefore(was.ctime, r.tick):
			differs, err := r.differs(rel, p, now.mode)
			if err != nil {
				return err
			}
			if differs {
				send = append(send, rel)
			} else {
				unchanged++
			}
		default:
			unchanged++
		}
		return nil
	})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing what the task changed: %w", err)
	}
	for rel := range r.entries {
		deleted = append(deleted, rel)
	}
	r.entries = nil
	return send, collapse(deleted), unchanged, nil
}

// differs compares the entry at p (rel in the directory) with the
// package's original by content.
func (r *record) differs(rel, p string, mode fs.FileMode) (bool, error) {
	orig := filepath.Join(r.src, filepath.FromSlash(rel))
	if mode.Type() == fs.ModeSymlink {
		a, err := os.Readlink(orig)
		if err != nil {
			return true, nil
		}
		b, err := os.Readlink(p)
		return a != b, err
	}
	return filesDiffer(orig, p)
}

func filesDiffer(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return true, nil // nothing to compare with: send it
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return true, nil
		}
		endA := errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF)
		endB := errors.Is(eb, io.EOF) || errors.Is(eb, io.ErrUnexpectedEOF)
		switch {
		case ea != nil && !endA:
			return true, nil
		case eb != nil && !endB:
			return false, eb
		case endA || endB:
			return endA != endB, nil
		}
	}
}

// collapse sorts names and drops those under another of them: removing
// a directory removes its entries.
func collapse(names []string) []string {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	out := names[:0]
	for _, n := range names {
		under := false
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			if set[d] {
				under = true
				break
			}
		}
		if !under {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// taskEnded is the TaskEnded event of a write-back task whose directory
// is dir: it writes the names to send into list (each ended by a NUL)
// and carries the deletions, within their bounds.
func (r *record) taskEnded(dir, list string) *agentv1.TaskEnded {
	send, deleted, unchanged, err := r.changes(dir)
	if err == nil {
		var buf bytes.Buffer
		for _, n := range send {
			buf.WriteString(n)
			buf.WriteByte(0)
		}
		err = os.WriteFile(list, buf.Bytes(), 0o600)
	}
	if err != nil {
		return &agentv1.TaskEnded{Error: err.Error()}
	}
	ev := &agentv1.TaskEnded{ChangesList: list, Changed: int64(len(send)), Unchanged: unchanged}
	size := 0
	for _, n := range deleted {
		size += len(n)
	}
	if len(deleted) > bounds.WriteBackDeletions || size > bounds.WriteBackDeletionBytes {
		ev.DeletedOverBound = true
		return ev
	}
	ev.Deleted = deleted
	return ev
}
