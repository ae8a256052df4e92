package runtime

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

var (
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ValidateRunUID checks a Run UID.
func ValidateRunUID(field, uid string) error {
	switch {
	case uid == "":
		return errdefs.InvalidArgument(field, "must not be empty")
	case len(uid) > bounds.RunUID:
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(uid), bounds.RunUID)
	}
	return nil
}

// ValidateDigest checks a registration digest: "sha256:" and 64 lowercase
// hex digits.
func ValidateDigest(field, d string) error {
	if !digestRE.MatchString(d) {
		return errdefs.InvalidArgument(field, "must be sha256: followed by 64 lowercase hex digits")
	}
	return nil
}

// Workspace confines working directories to one root.
type Workspace struct {
	root string // absolute, symlinks resolved
}

// NewWorkspace returns a Workspace rooted at dir, which must exist.
func NewWorkspace(dir string) (*Workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("workspace root %s: not a directory", dir)
	}
	return &Workspace{root: real}, nil
}

// Root is the resolved workspace root.
func (w *Workspace) Root() string { return w.root }

// Resolve checks that dir is absolute, exists, is a directory and, with
// symlinks followed, lies inside the root. It returns the resolved path.
func (w *Workspace) Resolve(field, dir string) (string, error) {
	if dir == "" {
		return "", errdefs.InvalidArgument(field, "must not be empty")
	}
	if !filepath.IsAbs(dir) {
		return "", errdefs.InvalidArgument(field, "%q is not an absolute path", dir)
	}
	if real, ok := w.plainBelow(dir); ok {
		return real, nil
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", errdefs.InvalidArgument(field, "%q does not exist", dir)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", errdefs.InvalidArgument(field, "%q is not a directory", dir)
	}
	if !Within(w.root, real) {
		return "", errdefs.InvalidArgument(field, "%q is outside the workspace root %s", dir, w.root)
	}
	return real, nil
}

// plainBelow is Resolve's common case without EvalSymlinks' lstat of every
// component from /: dir is clean, lies lexically under the (resolved) root,
// and each component below the root is a directory, not a symlink. Any
// other dir returns false and takes the general path.
func (w *Workspace) plainBelow(dir string) (string, bool) {
	if filepath.Clean(dir) != dir || dir == w.root || !Within(w.root, dir) {
		return "", false
	}
	rest := dir[len(w.root):]
	if w.root == "/" {
		rest = dir
	}
	p := w.root
	for _, c := range strings.Split(strings.TrimPrefix(rest, "/"), "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			return "", false
		}
	}
	return dir, true
}

// Within reports whether path equals root or lies beneath it. Both must be
// clean absolute paths.
func Within(root, path string) bool {
	if path == root {
		return true
	}
	if root == "/" {
		return strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, root+string(filepath.Separator))
}

// ResolveInside joins rel to dir and checks, with symlinks followed, that
// the result stays inside dir. A file that does not exist is returned as
// joined (the caller reports it as an initialisation failure).
func ResolveInside(dir, rel string) (string, error) {
	p := filepath.Join(dir, rel)
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		if os.IsNotExist(err) {
			return p, nil
		}
		return "", err
	}
	if !Within(dir, real) {
		return "", fmt.Errorf("%s resolves outside the working directory", rel)
	}
	return real, nil
}

// BaseEnv is the minimal environment every handler process starts from;
// the registration's env is applied on top. HOME is the working directory
// and TMPDIR a private directory, so handlers never see the server's own
// environment.
func BaseEnv(workingDir, tmpDir string) map[string]string {
	return map[string]string{
		"PATH":   "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":   workingDir,
		"LANG":   "C.UTF-8",
		"TMPDIR": tmpDir,
	}
}

// baseEnvWith is BaseEnv with extra added.
func baseEnvWith(extra map[string]string, workingDir, tmpDir string) map[string]string {
	m := BaseEnv(workingDir, tmpDir)
	maps.Copy(m, extra)
	return m
}

// MergeEnv returns base overlaid with extra as sorted "K=V" strings.
func MergeEnv(base, extra map[string]string) []string {
	m := make(map[string]string, len(base)+len(extra))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
