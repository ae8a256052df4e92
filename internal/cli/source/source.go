// Package source turns a local file or directory into a Run's
// spec.source: a text file becomes an inline source at its base name, a
// directory (or a file that is not UTF-8 text) a gzipped tar archive. The
// archive holds regular files and directories only, in a fixed order with
// fixed metadata, so the same tree always packs to the same bytes; it is
// bounded as the server bounds it, and nothing is skipped silently: what
// cannot be packed is an error naming the path.
package source

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Limits of a packed source.
const (
	// MaxPacked bounds the inline text or the compressed archive: the
	// server's spec.source bound.
	MaxPacked = bounds.Source
	// MaxUnpacked bounds what an archive may expand to: what runtimed
	// extracts at most.
	MaxUnpacked = 64 * bounds.Source
)

// Packed is a source ready for spec.source.
type Packed struct {
	Source *v1alpha1.Source
	// File is the base name of a single-file source ("" for a directory):
	// the file a task runs when given no entrypoint.
	File string
}

// Pack packs the file or directory at path.
func Pack(path string) (*Packed, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	switch {
	case fi.IsDir():
		tgz, err := packDir(path)
		if err != nil {
			return nil, err
		}
		return &Packed{Source: &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: tgz}}}, nil
	case fi.Mode().IsRegular():
		return packFile(path, fi)
	}
	return nil, errdefs.InvalidArgument("source", "%s is neither a regular file nor a directory", path)
}

func packFile(path string, fi fs.FileInfo) (*Packed, error) {
	name := filepath.Base(path)
	if fi.Size() > MaxPacked {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "source %s is %d bytes, at most %d allowed", path, fi.Size(), MaxPacked)
	}
	b, err := readFile(path, MaxPacked)
	if err != nil {
		return nil, err
	}
	if utf8.Valid(b) {
		return &Packed{Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: name, Text: string(b)}}, File: name}, nil
	}
	// Inline text is a JSON string, which cannot carry bytes that are not
	// UTF-8: such a file travels as a one-file archive instead.
	var p packer
	p.start()
	if err := p.addFile(name, fi.Mode(), b); err != nil {
		return nil, err
	}
	tgz, err := p.finish(path)
	if err != nil {
		return nil, err
	}
	return &Packed{Source: &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: tgz}}, File: name}, nil
}

// readFile reads at most limit bytes of path, failing past it (the file
// may grow after its stat).
func readFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "source %s exceeds %d bytes", path, limit)
	}
	return b, nil
}

// packDir archives the tree under root. A symlink is followed when it
// resolves to a regular file inside root (the archive holds a copy);
// any other symlink, and any device, socket or pipe, is an error.
func packDir(root string) ([]byte, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	realRoot, err = filepath.Abs(realRoot)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	var p packer
	p.start()
	// Walk the resolved root, so that a root given as a symlink is
	// descended into.
	err = filepath.WalkDir(realRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		rel, err := filepath.Rel(realRoot, path)
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			return p.addDir(name)
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return fmt.Errorf("source: %w", err)
			}
			return p.addPath(name, path, fi)
		case t&fs.ModeSymlink != 0:
			target, err := filepath.EvalSymlinks(path)
			if err != nil {
				return errdefs.InvalidArgument("source", "symlink %s: %v", path, err)
			}
			if !within(realRoot, target) {
				return errdefs.InvalidArgument("source", "symlink %s points outside %s", path, root)
			}
			fi, err := os.Stat(target)
			if err != nil {
				return fmt.Errorf("source: %w", err)
			}
			if !fi.Mode().IsRegular() {
				return errdefs.InvalidArgument("source", "symlink %s: only symlinks to regular files can be packed", path)
			}
			return p.addPath(name, target, fi)
		default:
			return errdefs.InvalidArgument("source", "%s: only regular files, directories and symlinks to files can be packed", path)
		}
	})
	if err != nil {
		return nil, err
	}
	return p.finish(root)
}

// within reports whether path is root or lies under it; both are absolute
// and free of symlinks.
func within(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// packer writes a deterministic, bounded tar.gz.
type packer struct {
	buf      bytes.Buffer
	gz       *gzip.Writer
	tw       *tar.Writer
	unpacked int64
}

func (p *packer) start() {
	p.gz, _ = gzip.NewWriterLevel(&p.buf, gzip.BestCompression) // a valid level: no error
	p.tw = tar.NewWriter(p.gz)
}

// epoch is every entry's modification time, so that packing is
// reproducible.
var epoch = time.Unix(0, 0).UTC()

func (p *packer) addDir(name string) error {
	return p.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
}

func (p *packer) addPath(name, path string, fi fs.FileInfo) error {
	if p.unpacked+fi.Size() > MaxUnpacked {
		return errdefs.Errorf(errdefs.ErrTooLarge, "source: the files add up to more than %d bytes (at %s)", MaxUnpacked, path)
	}
	b, err := readFile(path, MaxUnpacked-p.unpacked)
	if err != nil {
		return err
	}
	return p.addFile(name, fi.Mode(), b)
}

func (p *packer) addFile(name string, mode fs.FileMode, b []byte) error {
	p.unpacked += int64(len(b))
	if p.unpacked > MaxUnpacked {
		return errdefs.Errorf(errdefs.ErrTooLarge, "source: the files add up to more than %d bytes (at %s)", MaxUnpacked, name)
	}
	// Keep whether the file is executable; nothing else of its mode.
	perm := int64(0o644)
	if mode.Perm()&0o111 != 0 {
		perm = 0o755
	}
	if err := p.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: perm, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := p.tw.Write(b); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	return p.checkPacked(name)
}

func (p *packer) header(h *tar.Header) error {
	if err := p.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("source %s: %w", h.Name, err)
	}
	return p.checkPacked(h.Name)
}

// checkPacked fails as soon as the compressed output is over the bound,
// rather than after compressing everything.
func (p *packer) checkPacked(at string) error {
	if p.buf.Len() > MaxPacked {
		return errdefs.Errorf(errdefs.ErrTooLarge, "source: the compressed archive exceeds %d bytes (at %s)", MaxPacked, at)
	}
	return nil
}

func (p *packer) finish(root string) ([]byte, error) {
	if err := p.tw.Close(); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if err := p.gz.Close(); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if p.buf.Len() > MaxPacked {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "source %s: the compressed archive exceeds %d bytes (it is %d)", root, MaxPacked, p.buf.Len())
	}
	return p.buf.Bytes(), nil
}
