package runtimed

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// A checkout of a cached commit moves the spare made after the previous
// checkout into place (its files are the spare's inodes), and a step that
// then writes to its checkout in every way it can (appends, chmod, through
// a link, removes, adds) changes neither the cache's tree, nor an earlier
// checkout, nor the next checkout, which gets a fresh spare. Into a
// workspace that holds an entry already, the checkout merges as a copy
// does.
func TestCheckoutMovesASpareAndKeepsTheCacheSafe(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	commit, url := srv.Commit(t, "app", map[string]string{"a/x.txt": "one\n", "run.sh": "#!/bin/sh\necho hi\n", "link": "link:a/x.txt"})
	cacheDir := filepath.Join(t.TempDir(), "git")
	cache, err := gitsource.New(gitsource.Config{Dir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sp := newSpares(ctx, cache, nil)
	defer sp.close()
	src := &v1alpha1.Source{Git: &v1alpha1.GitSource{URL: url, Commit: commit}}
	fetch := func(ctx context.Context, g *v1alpha1.GitSource) (string, func(), error) {
		return cache.Tree(ctx, g.URL, g.Commit, "")
	}
	tree, release, err := cache.Tree(ctx, url, commit, "")
	if err != nil {
		t.Fatal(err)
	}
	release()
	work := t.TempDir()
	checkout := func(name string, shared bool) string {
		t.Helper()
		dir := filepath.Join(work, name)
		if err := materialise(ctx, nil, dir, shared, src, fetch, sp); err != nil {
			t.Fatalf("checkout %s: %v", name, err)
		}
		return dir
	}
	want := func(dir string) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(dir, "a/x.txt")); err != nil || string(b) != "one\n" {
			t.Errorf("%s/a/x.txt: %q, %v", dir, b, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, "run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
			t.Errorf("%s/run.sh: %v, %v", dir, fi, err)
		}
		if l, err := os.Readlink(filepath.Join(dir, "link")); err != nil || l != "a/x.txt" {
			t.Errorf("%s/link: %q, %v", dir, l, err)
		}
	}
	ino := func(p string) uint64 {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}

	first := checkout("first", false) // copies; the spare is made after it
	sp.idle()
	spares, _ := filepath.Glob(filepath.Join(cacheDir, "spares", "*", commit, "self", "a", "x.txt"))
	if len(spares) != 1 {
		t.Fatalf("no spare after the first checkout: %v", spares)
	}
	spareIno := ino(spares[0])
	second := checkout("second", false)
	if got := ino(filepath.Join(second, "a/x.txt")); got != spareIno {
		t.Errorf("the second checkout's a/x.txt is inode %d, not the spare's %d: it was not moved into place", got, spareIno)
	}
	if ino(filepath.Join(second, "a/x.txt")) == ino(filepath.Join(tree, "a/x.txt")) {
		t.Fatal("the checkout shares a file with the cache")
	}
	want(second)

	// The step writes to its checkout.
	f, err := os.OpenFile(filepath.Join(second, "link"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chmod(filepath.Join(second, "run.sh"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(second, "a/new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(second, "link")); err != nil {
		t.Fatal(err)
	}
	want(tree)
	want(first)
	if _, err := os.Lstat(filepath.Join(tree, "a/new")); err == nil {
		t.Error("a file the step made is in the cache")
	}

	sp.idle()
	third := checkout("third", false)
	want(third)
	if ino(filepath.Join(third, "a/x.txt")) == spareIno {
		t.Error("the third checkout has the second's files")
	}
	if _, err := os.Lstat(filepath.Join(third, "a/new")); err == nil {
		t.Error("the third checkout has the second's new file")
	}

	// A workspace that has an entry of the tree already: merged.
	sp.idle()
	shared := filepath.Join(work, "shared")
	if err := os.MkdirAll(filepath.Join(shared, "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shared, "a/keep"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	checkout("shared", true)
	want(shared)
	if b, err := os.ReadFile(filepath.Join(shared, "a/keep")); err != nil || string(b) != "k" {
		t.Errorf("shared/a/keep: %q, %v", b, err)
	}
}

// A spare being made when runtimed stops ends with the daemon's context,
// between files, rather than copying the whole tree first; it leaves no
// spare behind.
func TestSpareStopsWithTheDaemon(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	commit, url := srv.Commit(t, "app", map[string]string{"a": "1", "b": "2", "c/d": "3"})
	cache, err := gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git")})
	if err != nil {
		t.Fatal(err)
	}
	tree, release, err := cache.Tree(context.Background(), url, commit, "")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the daemon stopped
	err = cache.MakeSpare(context.Background(), tree, "self", func(_ context.Context, tree, dir string) error {
		return fillSpare(0, 0, false)(ctx, tree, dir)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("MakeSpare with the daemon stopped: %v, want context.Canceled", err)
	}
	if spare, ok := cache.TakeSpare(tree, "self"); ok {
		t.Errorf("a spare was left: %s", spare)
	}
}
