package runtimed

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
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

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/validation"
)

// maxExtracted bounds what an archive may expand to, so that a small
// compressed bomb cannot fill the disk.
const maxExtracted = 64 * bounds.Source

// materialise writes the Run's source into dir, which it creates empty
// (from dirs): a retried attempt that finds the last one's directory
// starts clean.
func materialise(dirs *runtime.DirPool, dir string, src *v1alpha1.Source) error {
	err := dirs.Make(dir)
	if errors.Is(err, fs.ErrExist) {
		if err = os.RemoveAll(dir); err != nil {
			return fmt.Errorf("clean working directory: %w", err)
		}
		err = dirs.Make(dir)
	}
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	switch {
	case src == nil:
		return nil
	case src.Inline != nil:
		return writeFile(dir, src.Inline.Path, strings.NewReader(src.Inline.Text), 0o755)
	case src.Archive != nil:
		return extract(dir, src.Archive.TarGz)
	}
	return nil
}

// writeFile writes rel inside dir, refusing paths that leave it.
func writeFile(dir, rel string, r io.Reader, mode os.FileMode) error {
	if err := validation.RelativePath("source path", rel); err != nil {
		return err
	}
	p := filepath.Join(dir, rel)
	if !runtime.Within(dir, p) {
		return errdefs.InvalidArgument("source path", "%q leaves the working directory", rel)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscallNoFollow, mode.Perm())
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("source %s: %w", rel, err)
	}
	return f.Close()
}

// extract unpacks a gzipped tar of regular files and directories into dir.
// Links, devices and paths that leave dir are refused.
func extract(dir string, tgz []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return errdefs.InvalidArgument("spec.source.archive", "not a gzip stream: %v", err)
	}
	tr := tar.NewReader(zr)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.InvalidArgument("spec.source.archive", "bad tar: %v", err)
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := validation.RelativePath("spec.source.archive", name); err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
				return fmt.Errorf("source: %w", err)
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxExtracted {
				return errdefs.Errorf(errdefs.ErrTooLarge, "spec.source.archive: expands to more than %d bytes", maxExtracted)
			}
			if err := writeFile(dir, name, io.LimitReader(tr, h.Size), os.FileMode(h.Mode)|0o600); err != nil {
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
