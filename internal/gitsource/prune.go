package gitsource

import (
	"os"
	"path/filepath"
	"time"

	"stoke.dev/stoke/internal/cacheprune"
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

// Prune removes the trees unused for MaxAge, then the least recently used
// until the rest fit in MaxBytes (internal/cacheprune's policy); never a
// tree in use (its use lock is held shared by a Tree caller) or one being
// fetched (not yet renamed into trees/). It returns how many it removed. A
// failure is logged: pruning is housekeeping, and a cache that is too
// large still works.
func (c *Cache) Prune() int {
	trees, err := c.trees()
	if err != nil {
		c.log.Warn("git: listing the cache to prune it", "err", err)
		return 0
	}
	res, err := cacheprune.Prune(trees, cacheprune.Policy{
		MaxBytes: c.cfg.MaxBytes, MaxAge: c.cfg.MaxAge, Trash: filepath.Join(c.cfg.Dir, "tmp"),
	}, c.cfg.Now())
	if err != nil {
		c.log.Warn("git: pruning", "err", err)
	}
	for _, t := range res.Gone {
		c.removeSpares(filepath.Base(filepath.Dir(t.Dir)), filepath.Base(t.Dir))
		os.Remove(filepath.Dir(t.Dir)) // the repository's directory, when it was its last tree
		c.log.Info("git: pruned", "tree", t.Key, "bytes", t.Bytes, "lastUsed", t.LastUse)
	}
	return res.Removed
}

// trees lists the cached trees with their size and last use.
func (c *Cache) trees() ([]cacheprune.Entry, error) {
	root := filepath.Join(c.cfg.Dir, "trees")
	keys, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []cacheprune.Entry
	for _, k := range keys {
		commits, err := os.ReadDir(filepath.Join(root, k.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		for _, cm := range commits {
			dir := filepath.Join(root, k.Name(), cm.Name())
			fi, err := os.Lstat(dir)
			if err != nil {
				continue
			}
			out = append(out, cacheprune.Entry{
				Key:     k.Name() + "/" + cm.Name(),
				Dir:     dir,
				Lock:    filepath.Join(c.cfg.Dir, "locks", useLock(k.Name(), cm.Name())),
				LastUse: fi.ModTime(),
				// A tree's spares (spare.go) count with it.
				Bytes: cacheprune.DirSize(dir) + cacheprune.DirSize(filepath.Join(c.cfg.Dir, "spares", k.Name(), cm.Name())),
			})
		}
	}
	return out, nil
}
