package pydeps

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

	"stoke.dev/stoke/internal/bounds"
)

// The cache's bounds, when Config leaves them at zero.
const (
	// DefaultMaxAge: a digest's directory not used for a week goes.
	DefaultMaxAge = 7 * 24 * time.Hour
	// DefaultMaxBytes: past 4 GiB in all, the least recently used
	// directories go first.
	DefaultMaxBytes = 4 << 30
	// minAge is the least time since its last use after which a directory
	// may go: a task does not hold its directory (only a registration
	// does, see Use), and none runs longer.
	minAge = bounds.MaxTaskDuration
)

// lockPath is the digest's lock file: held exclusively while it installs
// or is pruned, shared while a registration uses it; its modification
// time is the digest's last use.
func (c *Cache) lockPath(digest string) string {
	return filepath.Join(c.cfg.Root, "."+digest+".lock")
}

// touch marks the digest used now.
func (c *Cache) touch(digest string) {
	now := time.Now()
	if err := os.Chtimes(c.lockPath(digest), now, now); errors.Is(err, fs.ErrNotExist) {
		if f, err := os.OpenFile(c.lockPath(digest), os.O_RDWR|os.O_CREATE, 0o600); err == nil {
			f.Close()
		}
	}
}

// entry is one installed digest, for Prune.
type entry struct {
	digest  string
	lastUse time.Time
	size    int64
}

// Prune removes what the cache's bounds say must go: directories not used
// for MaxAge, then, while the cache is over MaxBytes, the least recently
// used first, but never one used within the longest task's time, and
// never one a registration holds (Use), nor one being installed: each is
// removed under its digest's exclusive lock, taken without waiting (a
// directory whose lock is held is in use and stays). Installs prune after
// they finish, and New prunes once, so the cache's size is bounded where
// it grows. It returns how many directories went and their size.
func (c *Cache) Prune(now time.Time) (removed int, freed int64, err error) {
	ents, err := os.ReadDir(c.cfg.Root)
	if err != nil {
		return 0, 0, fmt.Errorf("pydeps: prune: %w", err)
	}
	var all []entry
	var total int64
	for _, de := range ents {
		name := de.Name()
		switch {
		case de.IsDir() && isDigest(name):
			e := entry{digest: name, size: dirSize(filepath.Join(c.cfg.Root, name))}
			if fi, err := os.Stat(c.lockPath(name)); err == nil {
				e.lastUse = fi.ModTime()
			} else if fi, err := de.Info(); err == nil {
				e.lastUse = fi.ModTime()
			}
			all = append(all, e)
			total += e.size
		case de.IsDir() && strings.HasPrefix(name, ".install-"):
			// Left by a server that died installing: nothing renames it
			// into place any more once the longest install is over.
			if fi, err := de.Info(); err == nil && now.Sub(fi.ModTime()) > minAge {
				_ = os.RemoveAll(filepath.Join(c.cfg.Root, name))
			}
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return cmp.Or(a.lastUse.Compare(b.lastUse), strings.Compare(a.digest, b.digest)) })
	for _, e := range all {
		age := now.Sub(e.lastUse)
		if age <= c.maxAge && total <= c.maxBytes {
			break // the rest are newer
		}
		if age <= minAge {
			continue
		}
		ok, rerr := c.remove(e.digest)
		if rerr != nil {
			err = errors.Join(err, rerr)
			continue
		}
		if ok {
			removed++
			freed += e.size
			total -= e.size
		}
	}
	if removed > 0 {
		c.log.Info("python requirements cache pruned", "removed", removed, "freed_bytes", freed, "left_bytes", total)
	}
	return removed, freed, err
}

// remove deletes the digest's directory if nobody holds its lock; false
// when it is in use.
func (c *Cache) remove(digest string) (bool, error) {
	f, err := os.OpenFile(c.lockPath(digest), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return false, fmt.Errorf("pydeps: prune: %w", err)
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("pydeps: prune: lock: %w", err)
	}
	// Out of the way under the lock (a Use that waits for it then finds
	// nothing and installs again), removed at leisure.
	gone, err := os.MkdirTemp(c.cfg.Root, ".prune-")
	if err != nil {
		return false, fmt.Errorf("pydeps: prune: %w", err)
	}
	defer os.RemoveAll(gone)
	if err := os.Rename(filepath.Join(c.cfg.Root, digest), filepath.Join(gone, digest)); err != nil {
		return false, fmt.Errorf("pydeps: prune: %w", err)
	}
	return true, nil
}

// isDigest says whether name is a digest's directory name.
func isDigest(name string) bool {
	if len(name) != 64 {
		return false
	}
	for _, r := range name {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// dirSize is the size of the regular files under dir.
func dirSize(dir string) int64 {
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
