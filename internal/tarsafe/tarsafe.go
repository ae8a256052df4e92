// Package tarsafe is the one check of a tar entry before Stoke writes it
// under a directory: its name stays inside (not absolute, no '..' out, no
// NUL), its type is a regular file, a directory or (where allowed) a link
// that stays inside, and it does not go through a symbolic link an earlier
// entry of the same archive made. Every tar Stoke extracts or passes on
// (docker cp and artifacts through podcopy, git trees, Run source
// archives) is read through a Checker.
package tarsafe

import (
	"archive/tar"
	"path"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Policy says what an archive may hold.
type Policy struct {
	// Field names the input in errors ("archive", "source.git", ...).
	Field string
	// Links allows symbolic and hard links that stay inside.
	Links bool
}

// Checker checks one archive's entries in order.
type Checker struct {
	p     Policy
	links map[string]bool // symbolic links made by earlier entries
}

// New returns a Checker for one archive.
func New(p Policy) *Checker {
	if p.Field == "" {
		p.Field = "archive"
	}
	return &Checker{p: p, links: map[string]bool{}}
}

// Check checks the next entry and returns its clean relative name, or ""
// for an entry that writes nothing (the root directory itself, a pax
// global header): skip those. A refusal is InvalidArgument naming the
// entry.
func (c *Checker) Check(hdr *tar.Header) (string, error) {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return "", nil
	}
	q := bounds.Truncate(hdr.Name, bounds.Quoted)
	if Escapes(hdr.Name) {
		return "", errdefs.InvalidArgument(c.p.Field, "entry %q: names outside the destination (absolute or '..')", q)
	}
	name := path.Clean(hdr.Name)
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink, tar.TypeLink:
		if !c.p.Links {
			return "", errdefs.InvalidArgument(c.p.Field, "entry %q: links are not allowed here, only regular files and directories", q)
		}
		target := bounds.Truncate(hdr.Linkname, bounds.Quoted)
		if hdr.Typeflag == tar.TypeSymlink && (strings.HasPrefix(hdr.Linkname, "/") || Escapes(path.Join(path.Dir(name), hdr.Linkname))) {
			return "", errdefs.InvalidArgument(c.p.Field, "entry %q: a link to %q, outside the destination", q, target)
		}
		if hdr.Typeflag == tar.TypeLink {
			if Escapes(hdr.Linkname) {
				return "", errdefs.InvalidArgument(c.p.Field, "entry %q: a hard link to %q, outside the destination", q, target)
			}
			if err := c.throughLink(hdr.Linkname); err != nil {
				return "", err
			}
		}
	default:
		return "", errdefs.InvalidArgument(c.p.Field, "entry %q: type %q is not a file, directory or link (devices and FIFOs are refused)", q, string(hdr.Typeflag))
	}
	if err := c.throughLink(name); err != nil {
		return "", err
	}
	if hdr.Typeflag == tar.TypeSymlink {
		c.links[name] = true
	}
	if name == "." {
		return "", nil
	}
	return name, nil
}

// throughLink refuses a name that goes through a symbolic link an earlier
// entry made: each link alone stays inside, but a chain of them (a/b -> ..
// then a/b/c -> ..) can leave, and an entry under a link would be written
// wherever it points.
func (c *Checker) throughLink(name string) error {
	clean := path.Clean(name)
	for dir := path.Dir(clean); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if c.links[dir] {
			return errdefs.InvalidArgument(c.p.Field, "entry %q: goes through the link %q the archive made, outside the destination", bounds.Truncate(name, bounds.Quoted), bounds.Truncate(dir, bounds.Quoted))
		}
	}
	return nil
}

// Escapes reports whether a tar name leaves the directory it is relative
// to (or holds a NUL, which no file name can).
func Escapes(name string) bool {
	if strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
		return true
	}
	clean := path.Clean(name)
	return clean == ".." || strings.HasPrefix(clean, "../")
}
