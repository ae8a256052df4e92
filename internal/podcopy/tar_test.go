package podcopy

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/errdefs"
)

// tarOf writes headers (regular files get body "x").
func tarOf(t *testing.T, hdrs ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte("x"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestCopyChecked(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     []byte
		limit  int64
		status int
		want   string
	}{
		{"files, a link and a dir", tarOf(t, tar.Header{Name: "d/", Typeflag: tar.TypeDir}, tar.Header{Name: "d/f", Typeflag: tar.TypeReg},
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d/f"}), 10, http.StatusOK, ""},
		// Each link stays inside alone: a/b is the root, so a/b/c -> ..
		// is the root's parent.
		{"a chain of links", tarOf(t, tar.Header{Name: "a/", Typeflag: tar.TypeDir}, tar.Header{Name: "a/b", Typeflag: tar.TypeSymlink, Linkname: ".."},
			tar.Header{Name: "a/b/c", Typeflag: tar.TypeSymlink, Linkname: ".."}), 10, http.StatusBadRequest, "goes through the link"},
		{"a file under a link", tarOf(t, tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "."}, tar.Header{Name: "l/f", Typeflag: tar.TypeReg}),
			10, http.StatusBadRequest, "goes through the link"},
		{"a hard link through a link", tarOf(t, tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "."}, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "l/f"}),
			10, http.StatusBadRequest, "goes through the link"},
		{"over the bound", tarOf(t, tar.Header{Name: "f", Typeflag: tar.TypeReg}, tar.Header{Name: "g", Typeflag: tar.TypeReg}), 1, http.StatusRequestEntityTooLarge, "over 1 bytes"},
		{"not a tar", bytes.Repeat([]byte("x"), 1024), 10, http.StatusBadRequest, "not a tar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := CopyChecked(&out, bytes.NewReader(tc.in), tc.limit)
			if tc.status == http.StatusOK {
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for tr := tar.NewReader(&out); ; n++ {
					if _, err := tr.Next(); err == io.EOF {
						break
					} else if err != nil {
						t.Fatal(err)
					}
				}
				if n != 3 {
					t.Fatalf("%d entries copied, want 3", n)
				}
				return
			}
			if errdefs.HTTPStatus(err) != tc.status || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (%d), want %d %q", err, errdefs.HTTPStatus(err), tc.status, tc.want)
			}
		})
	}
}
