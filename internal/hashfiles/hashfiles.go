// Package hashfiles is GitHub Actions' hashFiles() over a workspace: the
// files that a list of glob patterns names (`**`, `!` excludes, files
// only), found in the order actions/runner's hashFiles finds them (a walk
// from each pattern's literal prefix, each directory's entries in byte
// order), and the SHA-256 of their SHA-256 digests; "" when no file
// matches. Every path is resolved through an os.Root of the workspace: a
// symbolic link is read when it stays inside and refused when it leads
// out. The workflow engine runs it on a job's pod as `stoke hash-files`
// (docs/workflows.md).
package hashfiles

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"stoke.dev/stoke/internal/bounds"
)

// Workspace hashes files under one directory.
type Workspace struct {
	root *os.Root
	// dir is the directory's absolute path (what relative patterns are
	// under; absolute patterns match against it), home the `~` of a
	// pattern.
	dir, home []string
	homeDir   string
}

// Open opens the workspace at dir; home is what a pattern's `~` stands
// for ("" for none).
func Open(dir, home string) (*Workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("hashFiles: %w", err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("hashFiles: %w", err)
	}
	if home == "" {
		home = "/nonexistent"
	}
	return &Workspace{root: root, dir: split(abs), home: split(filepath.Clean(home)), homeDir: filepath.Clean(home)}, nil
}

// Close closes the workspace's root.
func (w *Workspace) Close() error { return w.root.Close() }

func split(abs string) []string {
	var out []string
	for _, s := range strings.Split(abs, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Hash is hashFiles(patterns): patterns are one call's arguments joined by
// newlines. It returns the hex digest, "" when no file matches, and how
// many files it hashed.
func (w *Workspace) Hash(ctx context.Context, patterns string) (string, int, error) {
	pats, err := parsePatterns(patterns, "/"+strings.Join(w.dir, "/"), w.homeDir)
	if err != nil {
		return "", 0, fmt.Errorf("hashFiles: %w", err)
	}
	// Implicit descendants: a pattern that does not end in ** (or ends
	// in '/') brings everything below what it matches.
	var all []*pattern
	for _, p := range pats {
		all = append(all, p)
		if p.dirOnly || !p.endsInGlobstar() {
			all = append(all, p.withDescendants())
		}
	}
	h := &hasher{w: w, pats: all, sum: sha256.New()}
	for _, start := range w.starts(all) {
		if err := h.walk(ctx, start); err != nil {
			return "", h.files, fmt.Errorf("hashFiles: %w", err)
		}
	}
	if h.files == 0 {
		return "", 0, nil
	}
	return hex.EncodeToString(h.sum.Sum(nil)), h.files, nil
}

// starts are where the walks begin, in order: @actions/glob's search
// paths (each non-negated pattern's literal prefix, less those under
// another), as paths relative to the workspace. A search path above the
// workspace walks the workspace (what is outside it is never hashed); one
// beside it walks nothing.
func (w *Workspace) starts(pats []*pattern) [][]string {
	var paths [][]string
	for _, p := range pats {
		if !p.negate {
			paths = append(paths, p.searchPath())
		}
	}
	var out [][]string
	var included [][]string
	for i, sp := range paths {
		if slices.ContainsFunc(included, func(x []string) bool { return slices.Equal(x, sp) }) {
			continue
		}
		ancestor := false
		for j, other := range paths {
			if j != i && len(other) < len(sp) && slices.Equal(other, sp[:len(other)]) {
				ancestor = true
				break
			}
		}
		if ancestor {
			continue
		}
		included = append(included, sp)
		switch {
		case len(sp) >= len(w.dir) && slices.Equal(sp[:len(w.dir)], w.dir):
			out = append(out, sp[len(w.dir):])
		case len(sp) < len(w.dir) && slices.Equal(sp, w.dir[:len(sp)]):
			out = append(out, []string{})
		}
	}
	return out
}

type hasher struct {
	w     *Workspace
	pats  []*pattern
	sum   hash.Hash
	files int
}

func (h *hasher) match(abs []string) matchKind {
	m := matchNone
	for _, p := range h.pats {
		if p.negate {
			m &^= p.match(abs)
		} else {
			m |= p.match(abs)
		}
	}
	return m
}

func (h *hasher) partial(abs []string) bool {
	for _, p := range h.pats {
		if !p.negate && p.partialMatch(abs) {
			return true
		}
	}
	return false
}

func rel(elems []string) string {
	if len(elems) == 0 {
		return "."
	}
	return strings.Join(elems, "/")
}

// walk is @actions/glob's globGenerator from one search path, without
// following symbolic links (hashFiles' default): depth first, a
// directory's entries in byte order.
func (h *hasher) walk(ctx context.Context, start []string) error {
	if _, err := h.w.root.Lstat(rel(start)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	stack := [][]string{start}
	for len(stack) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		item := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		abs := append(slices.Clip(h.w.dir), item...)
		m := h.match(abs)
		if m == matchNone && !h.partial(abs) {
			continue
		}
		fi, err := h.w.root.Lstat(rel(item))
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			if m&matchFile != 0 {
				if err := h.file(item); err != nil {
					return err
				}
			}
			continue
		}
		names, err := h.readDir(item)
		if err != nil {
			return err
		}
		for i := len(names) - 1; i >= 0; i-- {
			stack = append(stack, append(slices.Clip(item), names[i]))
		}
	}
	return nil
}

func (h *hasher) readDir(item []string) ([]string, error) {
	d, err := h.w.root.Open(rel(item))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names) // byte order, as Node's readdir (libuv's scandir)
	return names, nil
}

// file adds one matched file's digest. A symbolic link is read through
// the root (refused if it leads out of the workspace); one to a directory
// is skipped, as GitHub skips it; a FIFO, socket or device is refused.
func (h *hasher) file(item []string) error {
	name := rel(item)
	f, err := h.w.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return nil
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	h.files++
	if h.files > bounds.HashFilesFiles {
		return fmt.Errorf("the patterns match more than %d files", bounds.HashFilesFiles)
	}
	one := sha256.New()
	if _, err := io.Copy(one, f); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	_, err = h.sum.Write(one.Sum(nil))
	return err
}

// OutputName is the output of a hash Run that holds call n's digest.
func OutputName(n int) string { return fmt.Sprintf("h%d", n) }

// WriteOutputs hashes each call (its patterns joined by newlines) in the
// workspace at dir and writes `h<n>=<digest>` lines to out, in GitHub's
// $GITHUB_OUTPUT syntax: what `stoke hash-files` does in a hash Run.
func WriteOutputs(ctx context.Context, dir, home string, calls []string, out io.Writer) error {
	if len(calls) > bounds.HashFilesCalls {
		return fmt.Errorf("hashFiles: %d calls, at most %d allowed", len(calls), bounds.HashFilesCalls)
	}
	w, err := Open(dir, home)
	if err != nil {
		return err
	}
	defer w.Close()
	var b strings.Builder
	for n, c := range calls {
		sum, _, err := w.Hash(ctx, c)
		if err != nil {
			return fmt.Errorf("%w (patterns %s)", err, bounds.Quote(c))
		}
		fmt.Fprintf(&b, "%s=%s\n", OutputName(n), sum)
	}
	_, err = io.WriteString(out, b.String())
	return err
}

// Command is the argv of a hash Run: `stoke hash-files CALL...`. The
// runtime server runs its own executable for "stoke"
// (runtime.SelfCommand), so the pod needs no stoke on its PATH.
func Command(calls []string) []string {
	return append([]string{"stoke", "hash-files"}, calls...)
}
