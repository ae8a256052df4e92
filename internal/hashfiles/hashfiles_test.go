package hashfiles

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tree is the test workspace: names in an order that sorted paths and
// GitHub's walk disagree on (a/b/go.sum before a/go.sum before a-c/go.sum).
func tree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.sum": "one\n", "go.mod": "mod\n", "a/go.sum": "two\n", "a/b/go.sum": "three\n", "a-c/go.sum": "four\n",
		".hidden/go.sum": "five\n", "sub/x.txt": "x\n", "sub/y.log": "y\n", "a/B.txt": "B\n", "sub/st*r": "star\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"link-in": "sub/x.txt", "dirlink": "sub"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// want is GitHub's algorithm written out: the SHA-256 of the files'
// SHA-256 digests, in the order given; "" for none.
func want(t *testing.T, dir string, files ...string) string {
	t.Helper()
	if len(files) == 0 {
		return ""
	}
	all := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		one := sha256.Sum256(b)
		all.Write(one[:])
	}
	return hex.EncodeToString(all.Sum(nil))
}

// TestHashMatchesGitHub: each case's files are the ones, in the order,
// that actions/runner's hashFiles (node, @actions/glob 0.5.0) hashed on
// this same tree; two digests are written out as it printed them.
func TestHashMatchesGitHub(t *testing.T) {
	dir := tree(t)
	w, err := Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	everything := []string{".hidden/go.sum", "a/B.txt", "a/b/go.sum", "a/go.sum", "a-c/go.sum", "go.mod", "go.sum", "link-in", "sub/st*r", "sub/x.txt", "sub/y.log"}
	cases := []struct {
		patterns string
		files    []string
		literal  string // the digest GitHub's printed, when written out
	}{
		{"**/go.sum", []string{".hidden/go.sum", "a/b/go.sum", "a/go.sum", "a-c/go.sum", "go.sum"}, "f7b18d59c42acd899c371b69a04be578bdd492a6fd818f15a06f8bf07abe97ed"},
		{"go.sum", []string{"go.sum"}, "9c64071fc196d33fec0036f48898b7ff2cf8398b892ead8afce6e9568f7fb6de"},
		{"sub/*.txt\n!sub/x.txt", nil, ""},
		{"sub/**\n!**/*.log", []string{"sub/st*r", "sub/x.txt"}, ""},
		{"a-c/go.sum\na/**", []string{"a-c/go.sum", "a/B.txt", "a/b/go.sum", "a/go.sum"}, ""}, // walks in the patterns' order
		{"**/go.sum\n!a/**", []string{".hidden/go.sum", "a-c/go.sum", "go.sum"}, ""},
		{"nomatch/**", nil, ""},
		{"link-in", []string{"link-in"}, ""}, // a link inside is read
		{"dirlink/**", nil, ""},              // a link to a directory is neither walked nor hashed
		{"sub/", []string{"sub/st*r", "sub/x.txt", "sub/y.log"}, ""},
		{"*", everything, ""},
		{".", everything, ""},
		{"!a/b/**\n**", everything, ""}, // the last pattern that matches decides
		{"[ab]/go.sum", []string{"a/go.sum"}, ""},
		{"./go.sum", []string{"go.sum"}, ""},
		{"**/go.sum\n!go.sum", []string{".hidden/go.sum", "a/b/go.sum", "a/go.sum", "a-c/go.sum"}, ""},
		{"**/go.sum\n!!go.sum", []string{".hidden/go.sum", "a/b/go.sum", "a/go.sum", "a-c/go.sum", "go.sum"}, ""},
		{"# comment\n  go.mod  ", []string{"go.mod"}, ""},
		{`sub/st\*r`, []string{"sub/st*r"}, ""},
		{"sub/st[*]r", []string{"sub/st*r"}, ""},
		{"sub/s?[!x]*", []string{"sub/st*r"}, ""},
		{"a/[A-Z].txt", []string{"a/B.txt"}, ""},
		{dir + "/a/**", []string{"a/B.txt", "a/b/go.sum", "a/go.sum"}, ""},
		{"/**/go.mod", []string{"go.mod"}, ""}, // above the workspace: only what is inside
		{"~/x", nil, ""},
		{"a/", []string{"a/B.txt", "a/b/go.sum", "a/go.sum"}, ""},
	}
	for _, c := range cases {
		got, n, err := w.Hash(context.Background(), c.patterns)
		if err != nil {
			t.Errorf("%q: %v", c.patterns, err)
			continue
		}
		if exp := want(t, dir, c.files...); got != exp || n != len(c.files) {
			t.Errorf("%q: got %q over %d files, want %q over %v", c.patterns, got, n, exp, c.files)
		}
		if c.literal != "" && got != c.literal {
			t.Errorf("%q: got %s, GitHub printed %s", c.patterns, got, c.literal)
		}
	}
}

func TestHashRefuses(t *testing.T) {
	dir := tree(t)
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bad"), 0o755))
	must(os.Symlink(outside, filepath.Join(dir, "bad", "out")))
	must(os.Symlink("nothing", filepath.Join(dir, "bad", "broken")))
	must(syscall.Mkfifo(filepath.Join(dir, "bad", "fifo"), 0o644))
	w, err := Open(dir, "")
	must(err)
	defer w.Close()
	for patterns, msg := range map[string]string{
		"bad/out":                 "escapes",
		"bad/broken":              "no such file",
		"bad/fifo":                "not a regular file",
		"a/./go.sum":              "relative pathing",
		"../x":                    "relative pathing",
		"!":                       "is empty",
		strings.Repeat("x", 2000): "at most 1024",
		strings.Repeat("a\n", 65): "more than 64 patterns",
	} {
		_, _, err := w.Hash(context.Background(), patterns)
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%.40q: got %v, want an error with %q", patterns, err, msg)
		}
	}
}
