package podcopy

import (
	"archive/tar"
	"errors"
	"io"
	"math"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/tarsafe"
)

// CopyChecked copies a tar entry by entry, refusing one that would write
// outside the directory it is extracted in (internal/tarsafe) and stopping with
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
	check := tarsafe.New(tarsafe.Policy{Field: "archive", Links: true})
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
		name, err := check.Check(hdr)
		if err != nil {
			return n, err
		}
		if name == "" {
			continue // the root itself or a pax global header: nothing to write
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
