package artifact

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	"stoke.dev/stoke/internal/podcopy"
)

// Extract writes the artifact tar r into dir (made if missing), as
// `stoke artifacts get -o DIR` does on the caller's machine. Every entry is
// checked first (podcopy.CopyChecked, at most limit bytes) and written
// through an os.Root, so that neither a name nor a link already in dir can
// take a write outside it. It returns the regular files written.
func Extract(dir string, r io.Reader, limit int64) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		err := podcopy.CopyChecked(pw, r, limit)
		pw.CloseWithError(err)
		checked <- err
	}()
	n, err := extract(root, pr)
	pr.CloseWithError(errors.New("the extraction ended"))
	if cerr := <-checked; cerr != nil && !errors.Is(cerr, io.ErrClosedPipe) {
		err = cerr
	}
	return n, err
}

func extract(root *os.Root, r io.Reader) (int, error) {
	tr := tar.NewReader(r)
	files := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, err
		}
		name := path.Clean(hdr.Name)
		if name == "." {
			continue
		}
		mode := fs.FileMode(hdr.Mode) & 0o777
		if dir := path.Dir(name); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return files, err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return files, err
			}
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode|0o200)
			if err != nil {
				return files, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return files, fmt.Errorf("%s: %w", name, err)
			}
			files++
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return files, err
			}
		case tar.TypeLink:
			_ = root.Remove(name)
			if err := root.Link(path.Clean(hdr.Linkname), name); err != nil {
				return files, err
			}
		}
	}
}
