package runtime

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
)

// DirPool keeps the empty directories of finished executions (working
// and scratch directories) for the next ones: a directory is moved into
// place with one rename instead of made, and an empty one is moved back
// instead of removed. On ext4 every inode freed makes the next inode
// allocation in its block group dearer for a few seconds (the allocator
// skips recently deleted inodes, reading each one's inode table entry),
// so directories made and removed for every short task made every file
// and directory created after them dearer too (docs/benchmarks.md).
//
// The pool lives in a private directory of its own on the same file
// system as the directories it hands out; what a previous process left
// there is removed when the pool is made. A pooled directory is always
// empty except for its inner directories, themselves empty: nothing of
// one execution reaches the next. It holds at most bounds.DirPool. A nil
// *DirPool keeps nothing: Make is MakeDir and Remove is RemoveDir.
type DirPool struct {
	root  string
	inner []string

	mu     sync.Mutex
	free   []string // names in root
	seq    uint64
	closed bool
}

// Close removes the pool's directory and what it keeps; from then on
// Remove removes. Safe to call more than once.
func (p *DirPool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.free = nil
	return os.RemoveAll(p.root)
}

// NewDirPool makes (anew) the pool directory root. Each directory the pool
// hands out holds the directories named inner, made with it.
func NewDirPool(root string, inner ...string) (*DirPool, error) {
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("directory pool %s: %w", root, err)
	}
	if err := MakeDir(root); err != nil {
		return nil, fmt.Errorf("directory pool %s: %w", root, err)
	}
	return &DirPool{root: root, inner: inner}, nil
}

// Make makes dir, with mode 0700 and its inner directories, from the pool
// when it has one, else with MakeDir. An existing dir is an error
// (fs.ErrExist), as with MakeDir.
func (p *DirPool) Make(dir string) error {
	if p == nil {
		return MakeDir(dir)
	}
	if name, ok := p.take(); ok {
		err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(p.root, name), unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EEXIST):
			p.put(name)
			return &fs.PathError{Op: "mkdir", Path: dir, Err: fs.ErrExist}
		}
		// Another file system, or a missing parent: that entry is no
		// use for dir; make it the usual way.
		_ = os.RemoveAll(filepath.Join(p.root, name))
	}
	if err := MakeDir(dir); err != nil {
		return err
	}
	for _, in := range p.inner {
		if err := MakeDir(filepath.Join(dir, in)); err != nil {
			_ = RemoveDir(dir)
			return err
		}
	}
	return nil
}

// Remove removes dir and what it holds, as RemoveDir does; a directory
// that holds nothing but its inner directories, empty, goes back to the
// pool instead while the pool is not full.
func (p *DirPool) Remove(dir string) error {
	if p == nil {
		return RemoveDir(dir)
	}
	if p.reusable(dir) && p.keep(dir) {
		return nil
	}
	for _, in := range p.inner {
		_ = syscall.Rmdir(filepath.Join(dir, in))
	}
	return RemoveDir(dir)
}

// keep moves dir into the pool unless the pool is full; under mu, so
// that the pool never holds more than its bound.
func (p *DirPool) keep(dir string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.free) >= bounds.DirPool {
		return false
	}
	p.seq++
	name := strconv.FormatUint(p.seq, 10)
	if unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, filepath.Join(p.root, name), unix.RENAME_NOREPLACE) != nil {
		return false
	}
	p.free = append(p.free, name)
	return true
}

// reusable reports whether dir holds exactly the inner directories, and
// they nothing.
func (p *DirPool) reusable(dir string) bool {
	names, ok := readNames(dir, len(p.inner)+1)
	if !ok || len(names) != len(p.inner) {
		return false
	}
	for _, in := range p.inner {
		if !slices.Contains(names, in) {
			return false
		}
		if inner, ok := readNames(filepath.Join(dir, in), 1); !ok || len(inner) > 0 {
			return false
		}
	}
	return true
}

// readNames reads at most n names of directory dir (not following a
// symlink); ok is false when dir is not a directory with mode 0700 (an
// execution may have opened its own to others) that could be read.
//
// A directory that a root server handed to the Runs' user
// (internal/runuser) is taken back first (its owner becomes this
// process's), before its names are read: from then on that user cannot
// add to it, even through a handle opened earlier, and the next execution
// gets a directory that is the server's own until the server hands it
// over afresh. reusable reads the directory before its inner ones, so
// each is taken back before what it holds is looked at.
func readNames(dir string, n int) ([]string, bool) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Mode() != fs.ModeDir|0o700 {
		return nil, false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		if unix.Fchown(int(f.Fd()), os.Geteuid(), os.Getegid()) != nil {
			return nil, false
		}
	}
	names, err := f.Readdirnames(n)
	if err != nil && err != io.EOF {
		return nil, false
	}
	return names, true
}

func (p *DirPool) take() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return "", false
	}
	name := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return name, true
}

func (p *DirPool) put(name string) {
	p.mu.Lock()
	p.free = append(p.free, name)
	p.mu.Unlock()
}
