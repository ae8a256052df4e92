package tarsafe

import (
	"archive/tar"
	"net/http"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/errdefs"
)

func TestCheck(t *testing.T) {
	ok := []tar.Header{
		{Name: "a", Typeflag: tar.TypeReg}, {Name: "d/", Typeflag: tar.TypeDir}, {Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "../a"},
		{Name: "h", Typeflag: tar.TypeLink, Linkname: "d/x"}, {Name: "./x/../y", Typeflag: tar.TypeReg},
	}
	bad := []tar.Header{
		{Name: "../a", Typeflag: tar.TypeReg}, {Name: "/etc/x", Typeflag: tar.TypeReg}, {Name: "a/../../b", Typeflag: tar.TypeReg},
		{Name: "a\x00b", Typeflag: tar.TypeReg},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "../../x"},
		{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}, {Name: "null", Typeflag: tar.TypeChar}, {Name: "f", Typeflag: tar.TypeFifo},
		{Name: "b", Typeflag: tar.TypeBlock},
	}
	for _, h := range ok {
		if name, err := New(Policy{Links: true}).Check(&h); err != nil || name == "" {
			t.Errorf("%s: %q, %v", h.Name, name, err)
		}
	}
	for _, h := range bad {
		if _, err := New(Policy{Links: true}).Check(&h); errdefs.HTTPStatus(err) != http.StatusBadRequest {
			t.Errorf("%s (%c → %s): %v, want 400", h.Name, h.Typeflag, h.Linkname, err)
		}
	}
	// Without links, both kinds are refused, naming the field.
	for _, h := range []tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "a"}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "a"}} {
		_, err := New(Policy{Field: "spec.source.archive"}).Check(&h)
		if errdefs.HTTPStatus(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "spec.source.archive") {
			t.Errorf("%s without links: %v, want 400 naming the field", h.Name, err)
		}
	}
	// The root and a pax global header write nothing.
	for _, h := range []tar.Header{{Name: "./", Typeflag: tar.TypeDir}, {Name: "pax_global_header", Typeflag: tar.TypeXGlobalHeader}} {
		if name, err := New(Policy{}).Check(&h); err != nil || name != "" {
			t.Errorf("%s: %q, %v; want skipped", h.Name, name, err)
		}
	}
}

// Each link alone stays inside; a chain of them, or an entry under one,
// does not.
func TestThroughLinks(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdrs []tar.Header
	}{
		{"a chain of links", []tar.Header{{Name: "a/", Typeflag: tar.TypeDir}, {Name: "a/b", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "a/b/c", Typeflag: tar.TypeSymlink, Linkname: ".."}}},
		{"a file under a link", []tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "l/f", Typeflag: tar.TypeReg}}},
		{"a hard link through a link", []tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "l/f"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Policy{Links: true})
			var err error
			for i := range tc.hdrs {
				if _, err = c.Check(&tc.hdrs[i]); err != nil {
					break
				}
			}
			if errdefs.HTTPStatus(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "goes through the link") {
				t.Errorf("%v, want 400 'goes through the link'", err)
			}
		})
	}
}
