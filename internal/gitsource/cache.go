package gitsource

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/tarsafe"
)

// Config configures a Cache.
type Config struct {
	// Dir is the cache's directory; it is made 0700 when missing.
	Dir string
	// Credentials, when set, give the Authorization header for a URL.
	Credentials Credentials
	// Git is the git binary (default: "git" on the PATH).
	Git string
	// Timeout bounds one git command (default 10 minutes).
	Timeout time.Duration
	// MaxBytes bounds the cached trees' size (default DefaultMaxBytes);
	// the least recently used go first.
	MaxBytes int64
	// MaxAge removes a tree not used for this long (default DefaultMaxAge).
	MaxAge time.Duration
	// Logger: nil discards.
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Cache is the git cache of one process; it may share Dir with others.
type Cache struct {
	cfg Config
	log *slog.Logger
}

// New makes the cache's directories.
func New(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("gitsource: Config.Dir is required")
	}
	if cfg.Git == "" {
		cfg.Git = "git"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "trees"), filepath.Join(cfg.Dir, "locks"), filepath.Join(cfg.Dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gitsource: %w", err)
		}
	}
	c := &Cache{cfg: cfg, log: logging.OrDiscard(cfg.Logger)}
	c.Prune()
	return c, nil
}

// Auth is what a fetch authenticates with: an Authorization header value,
// or "" for none.
type Auth string

// AuthFor is the Authorization the configured credentials give url.
func (c *Cache) AuthFor(url string) Auth {
	if c.cfg.Credentials == nil {
		return ""
	}
	return c.cfg.Credentials.For(url)
}

// Reachable asks the repository at url whether auth may read it (git
// ls-remote of HEAD), for a caller whose commit the cache may already
// hold from a fetch made with other credentials.
func (c *Cache) Reachable(ctx context.Context, url string, auth Auth) error {
	if _, err := c.git(ctx, "", auth, "ls-remote", "--", url, "HEAD"); err != nil {
		return fmt.Errorf("reading %s: %w", url, err)
	}
	return nil
}

var commitRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// Resolve returns the commit that ref names in the repository at url,
// asking the remote once (git ls-remote): a full ref (refs/…) as it is,
// otherwise a branch, then a tag, then the name itself (HEAD); a tag is
// its commit, not the tag object.
func (c *Cache) Resolve(ctx context.Context, url, ref string, auth Auth) (string, error) {
	// The peeled pattern lists an annotated tag's commit too.
	out, err := c.git(ctx, "", auth, "ls-remote", "--", url, ref, ref+"^{}")
	if err != nil {
		return "", fmt.Errorf("resolving ref %s of %s: %w", bounds.Quote(ref), url, err)
	}
	refs := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		sha, name, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && commitRE.MatchString(sha) {
			refs[name] = sha
		}
	}
	candidates := []string{ref + "^{}", ref} // an annotated tag's commit, not the tag
	if !strings.HasPrefix(ref, "refs/") {
		candidates = []string{"refs/heads/" + ref, "refs/tags/" + ref + "^{}", "refs/tags/" + ref, ref}
	}
	for _, name := range candidates {
		if sha, ok := refs[name]; ok {
			return sha, nil
		}
	}
	return "", errdefs.Errorf(errdefs.ErrNotFound, "ref %s is not in %s", bounds.Quote(ref), url)
}

// Tree returns the directory that holds commit's tree of the repository
// at url, fetching it first unless the cache has it. Callers only read
// it, and call release when done: until then Prune leaves it (a shared
// lock of the commit's use lock).
func (c *Cache) Tree(ctx context.Context, url, commit string, auth Auth) (dir string, release func(), err error) {
	if !commitRE.MatchString(commit) {
		return "", nil, errdefs.InvalidArgument("commit", "%s is not a full commit ID", bounds.Quote(commit))
	}
	sum := sha256.Sum256([]byte(url))
	key := hex.EncodeToString(sum[:8])
	dir = filepath.Join(c.cfg.Dir, "trees", key, commit)
	release, err = c.lock(ctx, useLock(key, commit), unix.LOCK_SH)
	if err != nil {
		return "", nil, err
	}
	if err := c.tree(ctx, url, commit, auth, key, dir); err != nil {
		release()
		return "", nil, err
	}
	// The directory's mtime is its last use, which Prune orders by.
	now := c.cfg.Now()
	if err := os.Chtimes(dir, now, now); err != nil {
		release()
		return "", nil, fmt.Errorf("gitsource: %w", err)
	}
	return dir, release, nil
}

// tree fetches commit into dir unless it is there.
func (c *Cache) tree(ctx context.Context, url, commit string, auth Auth, key, dir string) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	unlock, err := c.lock(ctx, key+"-"+commit, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Lstat(dir); err == nil {
		return nil // fetched while this one waited
	}
	started := time.Now()
	if err := c.fetch(ctx, url, commit, auth, dir); err != nil {
		return err
	}
	c.log.Info("git: fetched", "url", url, "commit", commit, "duration", time.Since(started))
	c.Prune()
	return nil
}

// lock takes the cache's lock of name (how: unix.LOCK_EX or LOCK_SH),
// waiting for another holder.
func (c *Cache) lock(ctx context.Context, name string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, "locks", name), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gitsource: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if err != unix.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("gitsource: lock: %w", err)
		}
		// Another fetch of the same commit is under way: wait for it,
		// and for the caller's context.
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// fetch fetches commit from url into a temporary directory, unpacks its
// tree there, and renames the tree to dir.
func (c *Cache) fetch(ctx context.Context, url, commit string, auth Auth, dir string) error {
	tmp, err := os.MkdirTemp(filepath.Join(c.cfg.Dir, "tmp"), "fetch-")
	if err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	defer os.RemoveAll(tmp)
	repo := filepath.Join(tmp, "repo")
	if _, err := c.git(ctx, "", "", "init", "-q", "--bare", repo); err != nil {
		return err
	}
	if _, err := c.git(ctx, repo, auth, "fetch", "-q", "--no-tags", "--depth=1", "--", url, commit); err != nil {
		return fmt.Errorf("fetching %s of %s: %w", commit, url, err)
	}
	archive := filepath.Join(tmp, "tree.tar")
	if _, err := c.git(ctx, repo, "", "archive", "--format=tar", "-o", archive, commit); err != nil {
		return fmt.Errorf("reading commit %s of %s: %w", commit, url, err)
	}
	tree := filepath.Join(tmp, "tree")
	if err := unpack(archive, tree); err != nil {
		return fmt.Errorf("commit %s of %s: %w", commit, url, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	if err := os.Rename(tree, dir); err != nil {
		return fmt.Errorf("gitsource: %w", err)
	}
	return nil
}

// unpack extracts git archive's tar into dir, checking every entry: no
// path leaves dir, no link points outside it, and the tree is bounded.
func unpack(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	check := tarsafe.New(tarsafe.Policy{Field: "source.git", Links: true})
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tree: %w", err)
		}
		name, err := check.Check(h)
		if err != nil {
			return err
		}
		if name == "" {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += h.Size; total > bounds.GitTree {
				return errdefs.Errorf(errdefs.ErrTooLarge, "source.git: the tree holds more than %d bytes", bounds.GitTree)
			}
			mode := os.FileMode(0o644)
			if h.Mode&0o100 != 0 {
				mode = 0o755
			}
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			w, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, io.LimitReader(tr, h.Size))
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
		default:
			// git archive writes only these; a submodule is left out.
			return errdefs.InvalidArgument("source.git", "the tree's entry %s is of an unknown type %q", bounds.Quote(name), h.Typeflag)
		}
	}
}

// maxGitOutput bounds what a git command's stdout and stderr keep.
const maxGitOutput = 1 << 20

// git runs the git CLI (in dir, when set) with the environment of
// gitEnv and returns its stdout; a failure carries the end of stderr.
func (c *Cache) git(ctx context.Context, dir string, auth Auth, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	cmd := exec.Command(c.cfg.Git, args...)
	cmd.Env = gitEnv(c.cfg.Dir, auth)
	var stdout, stderr tail
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := proc.Run(ctx, cmd, time.Second); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("git %s: %w", args[0], ctx.Err())
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return "", fmt.Errorf("git: %w", err) // it did not start
		}
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s", bounds.Truncate(msg, 1024))
	}
	return stdout.String(), nil
}

// gitEnv is git's whole environment: no system or global configuration,
// no prompt, only the http, https and git protocols, HOME in the cache,
// and the Authorization header, when there is one, as configuration
// through the environment (git config's GIT_CONFIG_COUNT), never an
// argument.
func gitEnv(home string, auth Auth) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C", "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_ALLOW_PROTOCOL=http:https:git", "GIT_PROTOCOL_FROM_USER=0",
	}
	if auth == "" {
		return append(env, "GIT_CONFIG_COUNT=0")
	}
	return append(env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: "+string(auth))
}

// tail keeps the last maxGitOutput bytes written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > maxGitOutput {
		t.b = append(t.b[:0:0], t.b[len(t.b)-maxGitOutput:]...)
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.b) }
