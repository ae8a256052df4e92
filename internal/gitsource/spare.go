package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Spares: a checkout copies the cached tree, file by file, so that a Run
// can never change the cache (no hard links: a step that writes a file
// in place would write the cache's copy). Copying costs about as much as
// `cp -r`, so a spare is made ahead of need: a complete private copy of a
// tree, for one owner (the user its files are handed to), under
// DIR/spares/<url key>/<commit>/<owner>, made in tmp/ and renamed there
// whole. A checkout takes it (one rename, out of spares/, so two
// checkouts never share one) and moves its entries into the working
// directory, which is as fast as the tree has top-level entries; the next
// spare is then made off the Run's path. A spare's files are new inodes,
// like a copy's, so the workspace is as writable, and the cache as safe,
// as with a copy. Prune removes a tree's spares with it and counts them
// in the cache's size.

// spareDir is where the spare of (key, commit) for owner waits.
func (c *Cache) spareDir(key, commit, owner string) string {
	return filepath.Join(c.cfg.Dir, "spares", key, commit, owner)
}

// treeKey is the (url key, commit) of a tree directory Tree returned.
func (c *Cache) treeKey(tree string) (key, commit string, err error) {
	rel, err := filepath.Rel(filepath.Join(c.cfg.Dir, "trees"), tree)
	if err != nil {
		return "", "", err
	}
	key, commit = filepath.Split(rel)
	key = filepath.Clean(key)
	if key == "." || filepath.Dir(key) != "." || !commitRE.MatchString(commit) {
		return "", "", fmt.Errorf("gitsource: %s is not a tree of the cache", tree)
	}
	return key, commit, nil
}

// TakeSpare claims the spare of tree (a directory Tree returned, still
// held) for owner: it is renamed to a new directory under the cache that
// only the caller knows, which the caller empties and then removes with
// DropSpare. ok is false when there is none.
func (c *Cache) TakeSpare(tree, owner string) (dir string, ok bool) {
	key, commit, err := c.treeKey(tree)
	if err != nil || !validOwner(owner) {
		return "", false
	}
	tmp, err := os.MkdirTemp(filepath.Join(c.cfg.Dir, "tmp"), "take-")
	if err != nil {
		return "", false
	}
	dir = filepath.Join(tmp, "tree")
	if err := os.Rename(c.spareDir(key, commit, owner), dir); err != nil {
		os.Remove(tmp)
		return "", false // none, or another checkout took it
	}
	return dir, true
}

// DropSpare removes a directory TakeSpare returned, with whatever the
// caller left in it.
func (c *Cache) DropSpare(dir string) {
	if err := os.RemoveAll(filepath.Dir(dir)); err != nil {
		c.log.Warn("git: removing a taken spare", "err", err)
	}
}

// MakeSpare makes the spare of tree for owner unless there is one or
// another process is making it: fill copies tree into dir (empty, made
// by the cache) as a checkout for owner would. The tree's use lock is
// held meanwhile, so Prune leaves it.
func (c *Cache) MakeSpare(ctx context.Context, tree, owner string, fill func(ctx context.Context, tree, dir string) error) error {
	key, commit, err := c.treeKey(tree)
	if err != nil {
		return err
	}
	if !validOwner(owner) {
		return fmt.Errorf("gitsource: spare owner %q", owner)
	}
	release, err := c.lock(ctx, useLock(key, commit), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer release()
	if _, err := os.Lstat(tree); err != nil {
		return nil // pruned meanwhile
	}
	unlock, ok, err := c.tryLock("spare-" + key + "-" + commit + "-" + owner)
	if err != nil || !ok {
		return err // being made elsewhere
	}
	defer unlock()
	dst := c.spareDir(key, commit, owner)
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(c.cfg.Dir, "tmp"), "spare-")
	if err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "tree")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	if err := fill(ctx, tree, dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	if err := os.Rename(dir, dst); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("gitsource: %w", err)
	}
	return nil
}

// removeSpares removes the spares of (key, commit), once Prune removed
// their tree. A spare made meanwhile for a tree fetched again may go too:
// its next checkout copies.
func (c *Cache) removeSpares(key, commit string) {
	dir := filepath.Join(c.cfg.Dir, "spares", key, commit)
	if _, err := os.Lstat(dir); err != nil {
		return
	}
	tmp, err := os.MkdirTemp(filepath.Join(c.cfg.Dir, "tmp"), "prune-")
	if err != nil {
		c.log.Warn("git: pruning spares", "commit", commit, "err", err)
		return
	}
	if err := os.Rename(dir, filepath.Join(tmp, "spares")); err != nil {
		c.log.Warn("git: pruning spares", "commit", commit, "err", err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		c.log.Warn("git: pruning spares", "commit", commit, "err", err)
	}
	os.Remove(filepath.Dir(dir)) // the repository's directory, when empty
}

// tryLock takes the cache's lock of name exclusively unless another
// holder has it (ok false then).
func (c *Cache) tryLock(name string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, "locks", name), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("gitsource: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("gitsource: lock: %w", err)
	}
	return func() { f.Close() }, true, nil
}

// validOwner: an owner names a directory; the caller's "uid.gid" or
// "self".
func validOwner(owner string) bool {
	if owner == "" || len(owner) > 64 {
		return false
	}
	for _, r := range owner {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r == '.' || r == '-') {
			return false
		}
	}
	return owner != "." && owner != ".."
}
