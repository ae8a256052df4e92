package podcopy

import (
	"archive/tar"
	"errors"
	"io"
	"math"
	"path"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// CopyChecked copies a tar entry by entry, refusing one that would write
// outside the directory it is extracted in (CheckEntry) and stopping with
// TooLarge once the entries' contents pass limit bytes. The copy carries
// only names, types, links, sizes, permission bits and times: no owners,
// no set-id bits, no extended attributes.
func CopyChecked(dst io.Writer, src io.Reader, limit int64) error {
	_, err := CopyCheckedEntries(dst, src, limit, math.MaxInt)
	return err
}

// CopyCheckedEntries is CopyChecked that also counts the entries and
// stops with TooLarge past maxEntries of them.
func CopyCheckedEntries(dst io.Writer, src io.Reader, limit int64, maxEntries int) (n int, _ error) {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(dst)
	links := map[string]bool{}
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// tar pads its output to a record (10 KiB by default) past
			// the end marker: read it to its end, so that the writer is
			// not cut off and a reader that checks at EOF (a digest)
			// has its say.
			if _, err := io.Copy(io.Discard, io.LimitReader(src, 64<<10)); err != nil {
				return n, err
			}
			return n, tw.Close()
		}
		if err != nil {
			return n, errdefs.Errorf(errdefs.ErrInvalidArgument, "the archive is not a tar: %v", err)
		}
		if n++; n > maxEntries {
			return n, errdefs.Errorf(errdefs.ErrTooLarge, "the archive has over %d entries", maxEntries)
		}
		if err := CheckEntry(hdr); err != nil {
			return n, err
		}
		if err := throughLink(links, hdr.Name); err != nil {
			return n, err
		}
		if hdr.Typeflag == tar.TypeLink {
			if err := throughLink(links, hdr.Linkname); err != nil {
				return n, err
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			links[path.Clean(hdr.Name)] = true
		}
		if total += hdr.Size; total > limit {
			return n, errdefs.Errorf(errdefs.ErrTooLarge, "the archive is over %d bytes", limit)
		}
		clean := &tar.Header{Typeflag: hdr.Typeflag, Name: hdr.Name, Linkname: hdr.Linkname, Size: hdr.Size,
			Mode: hdr.Mode & 0o777, ModTime: hdr.ModTime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(clean); err != nil {
			return n, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return n, err
		}
	}
}

// throughLink refuses an entry whose name goes through a symbolic link an
// earlier entry of the same archive made: each link alone stays inside,
// but a chain of them (a/b -> .. then a/b/c -> ..) can leave, and an entry
// under a link would be written wherever it points.
func throughLink(links map[string]bool, name string) error {
	clean := path.Clean(name)
	for dir := path.Dir(clean); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if links[dir] {
			return errdefs.InvalidArgument("archive", "entry %q: goes through the link %q the archive made, outside the destination", bounds.Truncate(name, bounds.Quoted), bounds.Truncate(dir, bounds.Quoted))
		}
	}
	return nil
}

// CheckEntry allows regular files, directories and links that stay within
// the directory the archive is extracted in.
func CheckEntry(hdr *tar.Header) error {
	name := bounds.Truncate(hdr.Name, bounds.Quoted)
	if Escapes(hdr.Name) {
		return errdefs.InvalidArgument("archive", "entry %q: names outside the destination (absolute or '..')", name)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink:
		if strings.HasPrefix(hdr.Linkname, "/") || Escapes(path.Join(path.Dir(hdr.Name), hdr.Linkname)) {
			return errdefs.InvalidArgument("archive", "entry %q: a link to %q, outside the destination", name, bounds.Truncate(hdr.Linkname, bounds.Quoted))
		}
	case tar.TypeLink:
		if Escapes(hdr.Linkname) {
			return errdefs.InvalidArgument("archive", "entry %q: a hard link to %q, outside the destination", name, bounds.Truncate(hdr.Linkname, bounds.Quoted))
		}
	default:
		return errdefs.InvalidArgument("archive", "entry %q: type %q is not a file, directory or link (devices and FIFOs are refused)", name, string(hdr.Typeflag))
	}
	return nil
}

// Escapes reports whether a tar name leaves the directory it is relative to.
func Escapes(name string) bool {
	if strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
		return true
	}
	clean := path.Clean(name)
	return clean == ".." || strings.HasPrefix(clean, "../")
}
