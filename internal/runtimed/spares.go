package runtimed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/validation"
)

// spares moves a git checkout into place from one of the cache's spare
// trees (gitsource's TakeSpare) and makes the next spare after each
// checkout, off the Run's path: a checkout of a cached commit is then a
// few renames instead of a copy of every file. nil spares always copy.
type spares struct {
	cache *gitsource.Cache
	ctx   context.Context
	log   *slog.Logger

	// off is set once a spare could not be renamed into a working
	// directory (another filesystem): none is made from then on.
	off atomic.Bool

	mu     sync.Mutex
	making map[string]bool // tree and owner
	closed bool
	wg     sync.WaitGroup
}

func newSpares(ctx context.Context, cache *gitsource.Cache, log *slog.Logger) *spares {
	if cache == nil {
		return nil
	}
	return &spares{cache: cache, ctx: ctx, log: logging.OrDiscard(log), making: map[string]bool{}}
}

// close makes no more spares and waits for those being made (their
// context ends first, with the daemon's).
func (sp *spares) close() {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.closed = true
	sp.mu.Unlock()
	sp.wg.Wait()
}

// idle waits for the spares being made (a benchmark's pause).
func (sp *spares) idle() {
	if sp != nil {
		sp.wg.Wait()
	}
}

// owner names whom t's files are handed to: the spare made for one owner
// is never moved into another's directory.
func (t *tree) owner() string {
	if !t.chown {
		return "self"
	}
	return fmt.Sprintf("%d.%d", t.uid, t.gid)
}

// checkout puts the cached tree at rel in t: a spare's entries renamed
// into place when there is a spare, else a copy; either way every file is
// t's own (new inodes), so nothing written in t reaches the cache.
func (t *tree) checkout(ctx context.Context, cached, rel string, sp *spares) error {
	if sp == nil {
		return t.copyTree(ctx, cached, rel)
	}
	owner := t.owner()
	defer sp.refill(cached, owner, t)
	spare, ok := sp.cache.TakeSpare(cached, owner)
	if !ok {
		return t.copyTree(ctx, cached, rel)
	}
	defer sp.cache.DropSpare(spare)
	if t.moveTree(spare, rel, sp) {
		return nil
	}
	// Some entry could not be moved (it is there already, or the spare
	// is on another filesystem): the copy goes over what was moved,
	// replacing files and merging directories, as into any workspace.
	return t.copyTree(ctx, cached, rel)
}

// moveTree renames every top-level entry of spare into rel (made when
// missing, opened through the os.Root: no link leads out of t), never
// over an entry that is there. It reports whether all moved.
func (t *tree) moveTree(spare, rel string, sp *spares) bool {
	if rel != "." {
		if err := validation.RelativePath("spec.source.git.path", rel); err != nil {
			return false
		}
	}
	if err := t.mkdirs(rel); err != nil {
		return false
	}
	dst, err := t.root.Open(rel)
	if err != nil {
		return false
	}
	defer dst.Close()
	src, err := os.Open(spare)
	if err != nil {
		return false
	}
	defer src.Close()
	names, err := src.Readdirnames(-1)
	if err != nil {
		return false
	}
	all := true
	for _, name := range names {
		err := unix.Renameat2(int(src.Fd()), name, int(dst.Fd()), name, unix.RENAME_NOREPLACE)
		if err == nil {
			continue
		}
		all = false
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			sp.off.Store(true)
			return false
		}
	}
	return all
}

// refill makes the spare of cached for owner in the background, unless
// one is being made.
func (sp *spares) refill(cached, owner string, t *tree) {
	if sp.off.Load() {
		return
	}
	key := cached + "\x00" + owner
	sp.mu.Lock()
	if sp.closed || sp.making[key] || sp.ctx.Err() != nil {
		sp.mu.Unlock()
		return
	}
	sp.making[key] = true
	sp.wg.Add(1)
	sp.mu.Unlock()
	uid, gid, chown := t.uid, t.gid, t.chown
	go func() {
		defer sp.wg.Done()
		err := sp.cache.MakeSpare(sp.ctx, cached, owner, fillSpare(uid, gid, chown))
		sp.mu.Lock()
		delete(sp.making, key)
		sp.mu.Unlock()
		if err != nil && sp.ctx.Err() == nil {
			sp.log.Warn("git: making a spare checkout", "error", err)
		}
	}()
}

// fillSpare copies a tree into a spare directory exactly as a checkout
// into a directory of (uid, gid)'s would (chown: it is not this
// process's user).
func fillSpare(uid, gid int, chown bool) func(ctx context.Context, cached, dir string) error {
	return func(ctx context.Context, cached, dir string) error {
		if chown {
			if err := os.Lchown(dir, uid, gid); err != nil {
				return err
			}
		}
		t, err := openTree(dir)
		if err != nil {
			return err
		}
		defer t.close()
		return t.copyTree(ctx, cached, ".")
	}
}
