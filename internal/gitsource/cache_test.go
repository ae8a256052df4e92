package gitsource_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

func newCache(t *testing.T, creds gitsource.Credentials) *gitsource.Cache {
	t.Helper()
	c, err := gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git"), Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A commit is fetched once, however many ask for it at once; its tree has
// the commit's files, modes and inner links; refs resolve to commits.
func TestTreeIsFetchedOncePerCommit(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	first, url := srv.Commit(t, "app", map[string]string{"README": "one\n", "bin/run.sh": "echo run\n", "docs/link": "link:../README"})
	second, _ := srv.Commit(t, "app", map[string]string{"README": "two\n"})
	srv.Tag(t, "app", "v1", first)
	c := newCache(t, nil)
	ctx := context.Background()

	var wg sync.WaitGroup
	dirs := make([]string, 8)
	errs := make([]error, 8)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var release func()
			dirs[i], release, errs[i] = c.Tree(ctx, url, first, "")
			if errs[i] == nil {
				release()
			}
		}()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("Tree %d: %q, %v (first %q)", i, dirs[i], errs[i], dirs[0])
		}
	}
	if n := srv.Fetches.Load(); n != 1 {
		t.Errorf("%d fetches for one commit asked 8 times at once, want 1", n)
	}
	dir := dirs[0]
	if b, err := os.ReadFile(filepath.Join(dir, "README")); err != nil || string(b) != "one\n" {
		t.Errorf("README %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin/run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("bin/run.sh: %v, %v; want executable", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "docs/link")); err != nil || target != "../README" {
		t.Errorf("docs/link -> %q, %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".git")); !os.IsNotExist(err) {
		t.Errorf("the tree holds .git: %v", err)
	}
	// Asked again: from the cache, no fetch.
	if again, release, err := c.Tree(ctx, url, first, ""); err != nil || again != dir || srv.Fetches.Load() != 1 {
		t.Errorf("again: %q, %v, %d fetches", again, err, srv.Fetches.Load())
	} else {
		release()
	}

	for ref, want := range map[string]string{"main": second, "refs/heads/main": second, "v1": first, "refs/tags/v1": first} {
		if got, err := c.Resolve(ctx, url, ref, ""); err != nil || got != want {
			t.Errorf("Resolve(%s) = %s, %v; want %s", ref, got, err, want)
		}
	}
	if _, err := c.Resolve(ctx, url, "nope", ""); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `ref "nope" is not in`) {
		t.Errorf("Resolve of a missing ref: %v", err)
	}
}

// Bad input fails with a clear error and leaves nothing in the cache: a
// URL that is no repository, an unknown commit, a link out of the tree.
func TestBadSourcesLeaveNothing(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	_, url := srv.Commit(t, "app", map[string]string{"a": "a"})
	bad, badURL := srv.Commit(t, "evil", map[string]string{"out": "link:../../../etc/passwd"})
	abs, _ := srv.Commit(t, "evil", map[string]string{"out": "link:/etc/passwd"})
	dir := filepath.Join(t.TempDir(), "git")
	c, err := gitsource.New(gitsource.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ name, url, commit, want string }{
		{"not a repository", srv.URL + "/nothing.git", strings.Repeat("a", 40), "not found"},
		{"unknown commit", url, strings.Repeat("0", 40), "not our ref"},
		{"link out", badURL, bad, `entry "out": a link to`},
		{"absolute link", badURL, abs, `entry "out": a link to "/etc/passwd", outside the destination`},
	} {
		if _, _, err := c.Tree(ctx, tc.url, tc.commit, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	for _, sub := range []string{"trees", "tmp"} {
		var left []string
		_ = filepath.WalkDir(filepath.Join(dir, sub), func(p string, d os.DirEntry, _ error) error {
			if d != nil && !d.IsDir() {
				left = append(left, p)
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("left in %s: %v", sub, left)
		}
	}
}

// Credentials from a git-credential-store file reach the server as Basic
// authentication through git's environment, never its arguments; without
// them the fetch fails.
func TestCredentialsFile(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{User: "ci", Password: "s3cret-pw"})
	commit, url := srv.Commit(t, "private", map[string]string{"a": "a"})
	file := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(file, []byte("# tokens\nhttps://x:y@example.com\n"+strings.Replace(srv.URL, "http://", "http://ci:s3cret-pw@", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := gitsource.ReadCredentialsFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := newCache(t, nil).Tree(ctx, url, commit, ""); err == nil {
		t.Fatal("fetched without credentials")
	}
	c := newCache(t, creds)
	auth := c.AuthFor(url)
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("ci:s3cret-pw")); string(auth) != want {
		t.Fatalf("AuthFor = %q", auth)
	}
	_, release, err := c.Tree(ctx, url, commit, auth)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if got, err := c.Resolve(ctx, url, "main", auth); err != nil || got != commit {
		t.Errorf("Resolve = %s, %v", got, err)
	}
	if c.AuthFor("http://elsewhere.example/x.git") != "" {
		t.Error("credentials for another host")
	}
	if _, err := gitsource.ReadCredentialsFile(writeFile(t, "no-user", "https://example.com\n")); err == nil || strings.Contains(err.Error(), "example.com") {
		t.Errorf("a bad line: %v (must name the line, not its content)", err)
	}
}

func writeFile(t *testing.T, name, content string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A CredentialsFile follows its file as the kubelet replaces a Secret
// volume's (a new file renamed over the old), and keeps the last good
// credentials when the new file cannot be read.
func TestCredentialsFileFollowsItsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "git-credentials")
	replace := func(content string) {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	basic := func(userpw string) gitsource.Auth {
		return gitsource.Auth("Basic " + base64.StdEncoding.EncodeToString([]byte(userpw)))
	}
	const url = "https://git.example/org/app.git"
	replace("https://ci:one@git.example\n")
	c, err := gitsource.OpenCredentialsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.For(url); got != basic("ci:one") {
		t.Fatalf("For = %q", got)
	}
	replace("https://ci:rotated-two@git.example/org\n")
	if got := c.For(url); got != basic("ci:rotated-two") {
		t.Errorf("after the file changed, For = %q", got)
	}
	replace("not a url at all, longer than before\n")
	if got := c.For(url); got != basic("ci:rotated-two") {
		t.Errorf("after a bad file, For = %q, want the last good credentials", got)
	}
	if _, err := gitsource.OpenCredentialsFile(filepath.Join(dir, "none")); err == nil {
		t.Error("opened a file that is not there")
	}
}
