package gitsource

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// DefaultMaxBytes is the default bound of the cached trees' size.
	DefaultMaxBytes = 4 << 30
	// DefaultMaxAge removes, by default, a tree unused for a week.
	DefaultMaxAge = 7 * 24 * time.Hour
)

// useLock names the lock a tree's users hold shared and Prune exclusive.
// Lock files are never removed: a pruner unlinking one could take a
// second file's lock while a user holds the first's.
func useLock(key, commit string) string { return "use-" + key + "-" + commit }

type cachedTree struct {
	key, commit, dir string
	used             time.Time
	bytes            int64
}

// Prune removes the trees unused for MaxAge, then the least recently used
// until the rest fit in MaxBytes; never a tree in use (its use lock is
// held shared by a Tree caller) or one being fetched (not yet renamed
// into trees/). It returns how many it removed. A failure is logged:
// pruning is housekeeping, and a cache that is too large still works.
func (c *Cache) Prune() int {
	trees, err := c.trees()
	if err != nil {
		c.log.Warn("git: listing the cache to prune it", "err", err)
		return 0
	}
	sort.Slice(trees, func(i, j int) bool { return trees[i].used.Before(trees[j].used) })
	var total int64
	for _, t := range trees {
		total += t.bytes
	}
	now, removed := c.cfg.Now(), 0
	for _, t := range trees {
		if total <= c.cfg.MaxBytes && now.Sub(t.used) < c.cfg.MaxAge {
			break // the rest are newer still
		}
		if c.remove(t) {
			total -= t.bytes
			removed++
		}
	}
	return removed
}

// remove removes t unless it is in use.
func (c *Cache) remove(t cachedTree) bool {
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, "locks", useLock(t.key, t.commit)), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		c.log.Warn("git: pruning", "commit", t.commit, "err", err)
		return false
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false // in use
	}
	// Out of trees/ at once (a rename), then removed at leisure: a user
	// arriving after the lock is let go fetches it again.
	tmp, err := os.MkdirTemp(filepath.Join(c.cfg.Dir, "tmp"), "prune-")
	if err != nil {
		c.log.Warn("git: pruning", "commit", t.commit, "err", err)
		return false
	}
	if err := os.Rename(t.dir, filepath.Join(tmp, "tree")); err != nil {
		os.Remove(tmp)
		c.log.Warn("git: pruning", "commit", t.commit, "err", err)
		return false
	}
	if err := os.RemoveAll(tmp); err != nil {
		c.log.Warn("git: pruning", "commit", t.commit, "err", err)
	}
	os.Remove(filepath.Dir(t.dir)) // the repository's directory, when it was its last tree
	c.log.Info("git: pruned", "commit", t.commit, "bytes", t.bytes, "lastUsed", t.used)
	return true
}

// trees lists the cached trees with their size and last use.
func (c *Cache) trees() ([]cachedTree, error) {
	root := filepath.Join(c.cfg.Dir, "trees")
	keys, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []cachedTree
	for _, k := range keys {
		commits, err := os.ReadDir(filepath.Join(root, k.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		for _, cm := range commits {
			t := cachedTree{key: k.Name(), commit: cm.Name(), dir: filepath.Join(root, k.Name(), cm.Name())}
			fi, err := os.Lstat(t.dir)
			if err != nil {
				continue
			}
			t.used = fi.ModTime()
			_ = filepath.WalkDir(t.dir, func(_ string, d fs.DirEntry, err error) error {
				if err == nil && d.Type().IsRegular() {
					if fi, err := d.Info(); err == nil {
						t.bytes += fi.Size()
					}
				}
				return nil
			})
			out = append(out, t)
		}
	}
	return out, nil
}
