package pydeps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cacheprune"
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

// Prune removes what the cache's bounds say must go (internal/cacheprune's
// policy): directories not used for MaxAge, then, while the cache is over
// MaxBytes, the least recently used first, but never one used within the
// longest task's time, and never one a registration holds (Use), nor one
// being installed: both hold the digest's lock. Installs prune after they
// finish, and New prunes once, so the cache's size is bounded where it
// grows. It returns how many directories went and their size.
func (c *Cache) Prune(now time.Time) (removed int, freed int64, err error) {
	ents, err := os.ReadDir(c.cfg.Root)
	if err != nil {
		return 0, 0, fmt.Errorf("pydeps: prune: %w", err)
	}
	var all []cacheprune.Entry
	for _, de := range ents {
		name := de.Name()
		switch {
		case de.IsDir() && isDigest(name):
			e := cacheprune.Entry{Key: name, Dir: filepath.Join(c.cfg.Root, name), Lock: c.lockPath(name)}
			e.Bytes = cacheprune.DirSize(e.Dir)
			if fi, err := os.Stat(e.Lock); err == nil {
				e.LastUse = fi.ModTime()
			} else if fi, err := de.Info(); err == nil {
				e.LastUse = fi.ModTime()
			}
			all = append(all, e)
		case de.IsDir() && strings.HasPrefix(name, ".install-"):
			// Left by a server that died installing: nothing renames it
			// into place any more once the longest install is over.
			if fi, err := de.Info(); err == nil && now.Sub(fi.ModTime()) > minAge {
				_ = os.RemoveAll(filepath.Join(c.cfg.Root, name))
			}
		}
	}
	res, err := cacheprune.Prune(all, cacheprune.Policy{MaxBytes: c.maxBytes, MaxAge: c.maxAge, MinAge: minAge, Trash: c.cfg.Root}, now)
	if err != nil {
		err = fmt.Errorf("pydeps: %w", err)
	}
	if res.Removed > 0 {
		c.log.Info("python requirements cache pruned", "removed", res.Removed, "freed_bytes", res.Freed, "left_bytes", res.Left)
	}
	return res.Removed, res.Freed, err
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
