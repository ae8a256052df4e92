// Package pydeps installs the Python dependencies a Run's source lists in
// its requirements.txt, with pip, once per distinct requirements digest,
// into a cache directory that the Runtime Servers of a Runtime share
// (standalone: under the data directory). The Python adapter puts the
// digest's directory on the handler's PYTHONPATH.
//
// An install takes a file lock of its digest (so that concurrent first
// registrations, in one process or in several sharing the cache, install
// once), installs into a temporary directory beside the cache's entries
// and renames it into place, so that a directory under its digest's name
// is always complete; a later registration with the same requirements
// finds it with one stat and installs nothing. pip installs wheels only
// (--only-binary=:all:), so nothing of a package runs at install time.
// Offline: FindLinks names a wheel directory and pip is told --no-index;
// otherwise pip uses the index settings of its own configuration files
// and PIP_* environment variables.
//
// The cache is bounded by age and size (Prune, after each install and
// at New); a registration holds its digest's lock shared while it lives
// (Use), and a directory is pruned only under that lock held exclusively,
// so none in use goes.
package pydeps

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/proc"
)

// File is the name of the requirements file in a Run's source.
const File = "requirements.txt"

// lockPoll is how often a registration waiting for another's install of
// the same digest retries the lock (flock has no context).
const lockPoll = 20 * time.Millisecond

// Config configures a Cache.
type Config struct {
	// Root is the cache directory, shared by the Runtime Servers of a
	// Runtime; made if missing.
	Root string
	// Python is the interpreter whose pip installs ("python3" if empty).
	Python string
	// FindLinks, when set, is a directory of wheels: pip installs from it
	// alone (--no-index --find-links). Empty: pip's own index settings.
	FindLinks string
	// PipArgs are more arguments of pip install, part of the digest: the
	// lambda Runtime Server's target platform (--platform, --python-version)
	// for packages installed into a Lambda package.
	PipArgs []string
	// Env is pip's environment; nil: this process's (pip reads its
	// configuration from HOME, XDG_CONFIG_HOME and PIP_* there).
	Env []string
	// MaxAge and MaxBytes bound the cache (Prune): defaults DefaultMaxAge
	// and DefaultMaxBytes; an age below the longest task's is raised to
	// it.
	MaxAge   time.Duration
	MaxBytes int64
	Logger   *slog.Logger
}

// Cache is a requirements cache.
type Cache struct {
	cfg      Config
	log      *slog.Logger
	maxAge   time.Duration
	maxBytes int64

	tagOnce sync.Once
	tag     string // the interpreter's cache tag, in every digest
	tagErr  error

	installs atomic.Int64
}

// New returns the cache of cfg.
func New(cfg Config) (*Cache, error) {
	if cfg.Root == "" {
		return nil, errors.New("pydeps: a cache directory is required")
	}
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if err := os.MkdirAll(cfg.Root, 0o755); err != nil {
		return nil, fmt.Errorf("pydeps: %w", err)
	}
	c := &Cache{cfg: cfg, log: logging.OrDiscard(cfg.Logger),
		maxAge: max(cmp.Or(cfg.MaxAge, DefaultMaxAge), minAge), maxBytes: cmp.Or(cfg.MaxBytes, DefaultMaxBytes)}
	if _, _, err := c.Prune(time.Now()); err != nil {
		c.log.Warn("python requirements cache: prune", "error", err)
	}
	return c, nil
}

// Installs is how many installs this Cache ran (not those it found done).
func (c *Cache) Installs() int64 { return c.installs.Load() }

// Dir returns the directory holding the dependencies that the
// requirements.txt of the source in dir lists, installing them first if
// no Runtime Server of the cache has; "" when dir has no requirements.txt.
// An install error carries pip's message (its last bytes, bounded). The
// directory is not held: Prune leaves it for the longest task's time
// after this call (a registration, which may live longer, takes Use).
func (c *Cache) Dir(ctx context.Context, dir string) (string, error) {
	final, _, err := c.ensure(ctx, dir)
	return final, err
}

// Use is Dir for a registration: the directory is held in use until
// release is called (a shared lock of its digest, which Prune never
// removes a directory under). release is never nil.
func (c *Cache) Use(ctx context.Context, dir string) (string, func(), error) {
	for {
		final, digest, err := c.ensure(ctx, dir)
		if err != nil || final == "" {
			return final, func() {}, err
		}
		release, err := c.lockShared(ctx, digest)
		if err != nil {
			return "", func() {}, err
		}
		if _, err := os.Stat(final); err == nil {
			return final, release, nil
		}
		release() // pruned between the two: install it again
	}
}

// ensure installs dir's requirements if their digest's directory is not
// there, and marks the digest used.
func (c *Cache) ensure(ctx context.Context, dir string) (final, digest string, _ error) {
	req := filepath.Join(dir, File)
	text, err := readRequirements(req)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	digest, err = c.digest(text)
	if err != nil {
		return "", "", err
	}
	final = filepath.Join(c.cfg.Root, digest)
	if _, err := os.Stat(final); err == nil {
		c.touch(digest)
		return final, digest, nil
	}
	unlock, err := c.lockToInstall(ctx, digest, final)
	if err != nil {
		return "", "", err
	}
	if unlock == nil {
		c.touch(digest)
		return final, digest, nil // installed while we waited
	}
	defer unlock()
	if _, err := os.Stat(final); err == nil {
		c.touch(digest)
		return final, digest, nil // installed while we took the lock
	}
	if err := c.install(ctx, dir, req, final); err != nil {
		return "", "", err
	}
	c.touch(digest)
	if _, _, err := c.Prune(time.Now()); err != nil {
		c.log.Warn("python requirements cache: prune", "error", err)
	}
	return final, digest, nil
}

// readRequirements reads a requirements file, bounded; a link or anything
// but a regular file is refused.
func readRequirements(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.InvalidArgument(File, "is not a regular file")
	}
	if fi.Size() > bounds.Requirements {
		return nil, errdefs.InvalidArgument(File, "is %d bytes, at most %d allowed", fi.Size(), bounds.Requirements)
	}
	return os.ReadFile(path)
}

// digest names the install of text: the requirements, the interpreter's
// version and where pip finds packages all make a different install.
func (c *Cache) digest(text []byte) (string, error) {
	c.tagOnce.Do(func() {
		cmd := exec.Command(c.cfg.Python, "-c", "import sys; print(sys.implementation.cache_tag)")
		var out bytes.Buffer
		cmd.Stdout = &out
		err := proc.Run(context.Background(), cmd, 0)
		c.tag, c.tagErr = strings.TrimSpace(out.String()), err
		if err != nil {
			c.tagErr = fmt.Errorf("pydeps: %s: %w", c.cfg.Python, err)
		}
	})
	if c.tagErr != nil {
		return "", c.tagErr
	}
	h := sha256.New()
	fmt.Fprintf(h, "pydeps 1\x00%s\x00%s\x00%q\x00", c.tag, c.cfg.FindLinks, c.cfg.PipArgs)
	h.Write(text)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockShared holds the digest's lock shared (in use) within ctx.
func (c *Cache) lockShared(ctx context.Context, digest string) (func(), error) {
	return c.lock(ctx, digest, unix.LOCK_SH, nil)
}

// lockToInstall takes the digest's lock exclusively, to install, within
// ctx; it stops waiting (nil unlock, nil error) once final exists. The
// registrations that use final hold the lock shared for as long as they
// live, so a waiter that went on asking for it exclusively after another's
// install had finished would wait for them all to end.
func (c *Cache) lockToInstall(ctx context.Context, digest, final string) (func(), error) {
	return c.lock(ctx, digest, unix.LOCK_EX, func() bool {
		_, err := os.Stat(final)
		return err == nil
	})
}

// lock takes the digest's file lock (how: unix.LOCK_EX or LOCK_SH)
// within ctx. If done is not nil and reports true while the lock is
// held by others, lock gives up waiting and returns a nil unlock.
func (c *Cache) lock(ctx context.Context, digest string, how int, done func() bool) (func(), error) {
	f, err := os.OpenFile(c.lockPath(digest), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pydeps: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if done != nil && errors.Is(err, unix.EWOULDBLOCK) && done() {
			f.Close()
			return nil, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("pydeps: lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another install of the same %s: %w", File, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// install runs pip into a temporary directory and renames it to final.
func (c *Cache) install(ctx context.Context, dir, req, final string) error {
	tmp, err := os.MkdirTemp(c.cfg.Root, ".install-")
	if err != nil {
		return fmt.Errorf("pydeps: %w", err)
	}
	defer os.RemoveAll(tmp) // nothing left after the rename
	args := []string{"-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-warn-script-location",
		"--only-binary=:all:", "--target", tmp, "-r", req}
	if c.cfg.FindLinks != "" {
		args = append(args, "--no-index", "--find-links", c.cfg.FindLinks)
	}
	args = append(args, c.cfg.PipArgs...)
	cmd := exec.Command(c.cfg.Python, args...)
	cmd.Dir = dir // a requirement's relative path is the source's
	cmd.Env = c.cfg.Env
	out := &tail{max: bounds.Message / 2} // room for the rest of fatal_error
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	c.installs.Add(1)
	// Cancelled, pip and what it started get SIGTERM, and SIGKILL 5 s
	// later.
	if err := proc.Run(ctx, cmd, 5*time.Second); err != nil {
		msg := strings.TrimSpace(out.String())
		if ctx.Err() != nil {
			return fmt.Errorf("%s: pip install did not finish: %w", File, ctx.Err())
		}
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s: pip install failed (%v): %s", File, err, msg)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp makes it 0700
		return fmt.Errorf("pydeps: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("pydeps: %w", err)
	}
	c.log.Info("python requirements installed", "dir", final, "duration", time.Since(start))
	return nil
}

// tail keeps the last max bytes written to it (pip's error is at the end).
type tail struct {
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string { return bounds.TruncateHead(string(t.b), t.max) }
