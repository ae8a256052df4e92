package runtimed

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/tarsafe"
	"stoke.dev/stoke/internal/validation"
)

// maxExtracted bounds what an archive may expand to, so that a small
// compressed bomb cannot fill the disk.
const maxExtracted = 64 * bounds.Source

// materialise writes the Run's source into dir. A Run's own directory is
// made empty (from dirs): a retried attempt that finds the last one's
// directory starts clean. A shared workspace (spec.placement.workspace) is
// made when missing and otherwise kept as the Runs before left it: then
// it, and what is in it, may be the Runs' user's, who could have left
// symbolic links anywhere in it, so every write goes through an os.Root
// (no path, link or '..' leads out of dir) and what is written is handed
// to the workspace's owner.
//
// A git source (fetch gives its commit's tree in the cache) is copied in
// first, at its path; an inline file or an archive is then written over
// it. The copy never shares a file with the cache, so that no Run can
// change what the next one checks out; sp, when set, moves a spare copy
// made ahead into place instead (spares.go).
func materialise(ctx context.Context, dirs *runtime.DirPool, dir string, shared bool, src *v1alpha1.Source, fetch gitFetch, sp *spares) error {
	if err := prepareDir(dirs, dir, shared); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	if src == nil || (src.Inline == nil && src.Archive == nil && src.Git == nil) {
		return nil
	}
	w, err := openTree(dir)
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	defer w.close()
	if g := src.Git; g != nil {
		cached, release, err := fetch(ctx, g)
		if err != nil {
			return err
		}
		err = w.checkout(ctx, cached, gitPath(g.Path), sp)
		release()
		if err != nil {
			return fmt.Errorf("checking out %s: %w", g.URL, err)
		}
	}
	switch {
	case src.Inline != nil:
		return w.writeFile(src.Inline.Path, strings.NewReader(src.Inline.Text), 0o755)
	case src.Archive != nil:
		return w.extract(src.Archive.TarGz)
	}
	return nil
}

// prepareDir makes dir: empty for a Run's own, kept for a shared one.
func prepareDir(dirs *runtime.DirPool, dir string, shared bool) error {
	if shared {
		err := os.Mkdir(dir, 0o700)
		if errors.Is(err, fs.ErrExist) {
			fi, lerr := os.Lstat(dir)
			if lerr != nil {
				return lerr
			}
			if !fi.IsDir() {
				return fmt.Errorf("workspace is not a directory (%s)", fi.Mode().Type())
			}
			return nil
		}
		return err
	}
	err := dirs.Make(dir)
	if errors.Is(err, fs.ErrExist) {
		if err = os.RemoveAll(dir); err != nil {
			return fmt.Errorf("clean: %w", err)
		}
		err = dirs.Make(dir)
	}
	return err
}

// tree writes into one directory through an os.Root, handing what it
// makes to the directory's owner when that is not this process.
type tree struct {
	root     *os.Root
	uid, gid int
	chown    bool
}

func openTree(dir string) (*tree, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	fi, err := root.Stat(".")
	if err != nil {
		root.Close()
		return nil, err
	}
	t := &tree{root: root}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		t.uid, t.gid, t.chown = int(st.Uid), int(st.Gid), true
	}
	return t, nil
}

func (t *tree) close() { t.root.Close() }

// own hands rel to the directory's owner.
func (t *tree) own(rel string) error {
	if !t.chown {
		return nil
	}
	return t.root.Lchown(rel, t.uid, t.gid)
}

// mkdirs makes the directories of rel (a cleaned relative path) that are
// missing, each handed to the owner.
func (t *tree) mkdirs(rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	if err := t.mkdirs(filepath.Dir(rel)); err != nil {
		return err
	}
	err := t.root.Mkdir(rel, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return t.own(rel)
}

// writeFile writes rel inside the tree, refusing paths that leave it. An
// existing file is replaced, never written through (it could be a second
// name of another file).
func (t *tree) writeFile(rel string, r io.Reader, mode os.FileMode) error {
	if err := validation.RelativePath("source path", rel); err != nil {
		return err
	}
	rel = filepath.Clean(rel)
	if err := t.mkdirs(filepath.Dir(rel)); err != nil {
		return fmt.Errorf("source %s: %w", rel, err)
	}
	f, err := t.create(rel, mode)
	if err != nil {
		return fmt.Errorf("source %s: %w", rel, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("source %s: %w", rel, err)
	}
	if t.chown {
		if err := f.Chown(t.uid, t.gid); err != nil {
			f.Close()
			return fmt.Errorf("source %s: %w", rel, err)
		}
	}
	return f.Close()
}

// create makes the file rel anew: one that is there is removed first.
func (t *tree) create(rel string, mode os.FileMode) (*os.File, error) {
	const flags = os.O_CREATE | os.O_EXCL | os.O_WRONLY | syscallNoFollow
	f, err := t.root.OpenFile(rel, flags, mode.Perm())
	if errors.Is(err, fs.ErrExist) {
		if err := t.root.Remove(rel); err != nil {
			return nil, err
		}
		f, err = t.root.OpenFile(rel, flags, mode.Perm())
	}
	return f, err
}

// gitPath is where in the working directory source.git's tree goes.
func gitPath(p string) string {
	if p == "" {
		return "."
	}
	return filepath.Clean(p)
}

// copyTree copies the directory src (a tree in the git cache: regular
// files, directories and links that stay inside it) to rel in the tree.
// Files are copied (copy_file_range), never linked. It stops, between
// entries, once ctx is done (runtimed stopping, the Run cancelled).
func (t *tree) copyTree(ctx context.Context, src, rel string) error {
	if rel != "." {
		if err := validation.RelativePath("spec.source.git.path", rel); err != nil {
			return err
		}
	}
	if err := t.mkdirs(rel); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		inner, err := filepath.Rel(src, p)
		if err != nil || inner == "." {
			return err
		}
		dst := filepath.Join(rel, inner)
		switch {
		case d.IsDir():
			return t.mkdirs(dst)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := t.root.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if err := t.root.Symlink(target, dst); err != nil {
				return err
			}
			return t.own(dst)
		case d.Type().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			fi, err := in.Stat()
			if err != nil {
				return err
			}
			return t.writeFile(dst, in, fi.Mode())
		}
		return fmt.Errorf("%s: not a file, directory or link", inner)
	})
}

// extract unpacks a gzipped tar of regular files and directories into the
// tree. Links, devices and paths that leave it are refused.
func (t *tree) extract(tgz []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return errdefs.InvalidArgument("spec.source.archive", "not a gzip stream: %v", err)
	}
	tr := tar.NewReader(zr)
	check := tarsafe.New(tarsafe.Policy{Field: "spec.source.archive"})
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.InvalidArgument("spec.source.archive", "bad tar: %v", err)
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
			if err := t.mkdirs(name); err != nil {
				return fmt.Errorf("source: %w", err)
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxExtracted {
				return errdefs.Errorf(errdefs.ErrTooLarge, "spec.source.archive: expands to more than %d bytes", maxExtracted)
			}
			if err := t.writeFile(name, io.LimitReader(tr, h.Size), os.FileMode(h.Mode)|0o600); err != nil {
				return err
			}
		default:
			return errdefs.InvalidArgument("spec.source.archive", "%s: only regular files and directories are allowed", h.Name)
		}
	}
}

// digest is the registration_digest of a function Run: sha256 over the
// canonical source identity, handler, sorted env and idle timeout — never
// the working-directory path, so that the same Run registered again in
// another directory is recognised.
func digest(run *v1alpha1.Run) string {
	type envVar struct{ Name, Value string }
	canon := struct {
		Source      string   `json:"source"`
		Handler     string   `json:"handler"`
		Env         []envVar `json:"env"`
		IdleTimeout int64    `json:"idleTimeoutSeconds"`
	}{}
	if src := run.Spec.Source; src != nil {
		h := sha256.New()
		switch {
		case src.Inline != nil:
			fmt.Fprintf(h, "inline\x00%s\x00%s", src.Inline.Path, src.Inline.Text)
		case src.Archive != nil:
			h.Write([]byte("archive\x00"))
			h.Write(src.Archive.TarGz)
		}
		canon.Source = hex.EncodeToString(h.Sum(nil))
	}
	if fn := run.Spec.Mode.Function; fn != nil {
		canon.Handler = fn.Handler
		canon.IdleTimeout = fn.IdleTimeoutSeconds
	}
	for _, e := range run.Spec.Env {
		canon.Env = append(canon.Env, envVar{e.Name, e.Value})
	}
	slices.SortFunc(canon.Env, func(a, b envVar) int { return strings.Compare(a.Name, b.Name) })
	b, _ := json.Marshal(canon) // plain strings and ints: cannot fail
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func envMap(run *v1alpha1.Run) map[string]string {
	if len(run.Spec.Env) == 0 {
		return nil
	}
	m := make(map[string]string, len(run.Spec.Env))
	for _, e := range run.Spec.Env {
		m[e.Name] = e.Value
	}
	return m
}
