// Package cacheprune is the one eviction policy of Stoke's on-disk caches
// (the Python requirements cache, the git source cache): entries unused
// for longer than a maximum age go, then the least recently used until the
// rest fit a size bound; never an entry used less than a minimum age ago, and
// never one in use, which its users mark by holding its lock file shared.
// The caches own their layout; this package owns the choice and the
// removal.
package cacheprune

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Entry is one cached directory.
type Entry struct {
	// Key identifies the entry in logs and breaks ties in the order.
	Key string
	// Dir is the directory removed.
	Dir string
	// Lock is the entry's lock file: its users hold it shared (flock),
	// removal takes it exclusive without waiting. Created when missing;
	// never removed, since a pruner unlinking one could take a second
	// file's lock while a user holds the first's.
	Lock string
	// LastUse orders eviction and is compared with the ages.
	LastUse time.Time
	// Bytes is the entry's size, counted against MaxBytes.
	Bytes int64
}

// Policy bounds a cache.
type Policy struct {
	// MaxBytes is the bound of all entries' size.
	MaxBytes int64
	// MaxAge: an entry unused for longer goes.
	MaxAge time.Duration
	// MinAge: an entry used less than MinAge ago stays even over MaxBytes
	// (users that do not hold the lock, such as a task, are not longer).
	MinAge time.Duration
	// Trash is a directory on the cache's filesystem: an entry is renamed
	// into it under the lock, at once out of its users' sight, and removed
	// from there.
	Trash string
}

// Result says what Prune did.
type Result struct {
	Removed int
	Freed   int64
	Left    int64
	// Gone lists the removed entries, in eviction order.
	Gone []Entry
}

// Prune removes, from entries, what p says must go, at time now. An entry
// whose lock is held is in use and stays. Errors of single entries are
// joined; the others are still pruned.
func Prune(entries []Entry, p Policy, now time.Time) (Result, error) {
	all := slices.Clone(entries)
	slices.SortFunc(all, func(a, b Entry) int {
		return cmp.Or(a.LastUse.Compare(b.LastUse), strings.Compare(a.Key, b.Key))
	})
	var res Result
	for _, e := range all {
		res.Left += e.Bytes
	}
	var errs error
	for _, e := range all {
		age := now.Sub(e.LastUse)
		if age <= p.MaxAge && res.Left <= p.MaxBytes {
			break // the rest are newer
		}
		if age < p.MinAge {
			continue
		}
		ok, err := Remove(e, p.Trash)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		if ok {
			res.Removed++
			res.Freed += e.Bytes
			res.Left -= e.Bytes
			res.Gone = append(res.Gone, e)
		}
	}
	return res, errs
}

// Remove removes e's directory unless its lock is held (false, nil).
func Remove(e Entry, trash string) (bool, error) {
	f, err := os.OpenFile(e.Lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return false, fmt.Errorf("prune %s: %w", e.Key, err)
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("prune %s: lock: %w", e.Key, err)
	}
	// Out of the way under the lock (a user waiting for it then finds
	// nothing and makes the entry again), removed at leisure.
	gone, err := os.MkdirTemp(trash, ".prune-")
	if err != nil {
		return false, fmt.Errorf("prune %s: %w", e.Key, err)
	}
	defer os.RemoveAll(gone)
	if err := os.Rename(e.Dir, filepath.Join(gone, "entry")); err != nil {
		return false, fmt.Errorf("prune %s: %w", e.Key, err)
	}
	return true, nil
}

// DirSize is the size of the regular files under dir.
func DirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
