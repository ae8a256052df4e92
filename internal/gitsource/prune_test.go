package gitsource_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// Prune removes trees over the size bound (least recently used first) and
// trees unused for MaxAge, never one a Tree caller has not released.
func TestPruneKeepsWhatIsInUse(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	a, url := srv.Commit(t, "app", map[string]string{"f": "aaaa"})
	b, _ := srv.Commit(t, "app", map[string]string{"f": "bbbb"})
	cc, _ := srv.Commit(t, "app", map[string]string{"f": "cccc"})
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	// Any one tree is over the size bound: only use keeps a tree.
	c, err := gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git"), MaxBytes: 1, MaxAge: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tree := func(commit string) (string, func()) {
		t.Helper()
		advance(time.Second)
		dir, release, err := c.Tree(ctx, url, commit, "")
		if err != nil {
			t.Fatal(err)
		}
		return dir, release
	}
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }

	dirA, releaseA := tree(a) // held throughout
	dirB, releaseB := tree(b)
	releaseB()
	dirC, releaseC := tree(cc) // its fetch prunes: B goes, A and C are in use
	if !exists(dirA) || !exists(dirC) {
		t.Fatalf("a tree in use was pruned: A %v, C %v", exists(dirA), exists(dirC))
	}
	if exists(dirB) {
		t.Errorf("B, released and over the bound, is still there")
	}
	if n := c.Prune(); n != 0 {
		t.Errorf("Prune removed %d trees, all in use", n)
	}
	if b, err := os.ReadFile(filepath.Join(dirA, "f")); err != nil || string(b) != "aaaa" {
		t.Errorf("A's file: %q, %v", b, err)
	}
	releaseC()
	if n := c.Prune(); n != 1 || exists(dirC) || !exists(dirA) {
		t.Errorf("Prune removed %d; C there %v, A there %v; want C gone, A kept", n, exists(dirC), exists(dirA))
	}
	releaseA()

	// By age, with room to spare: the tree unused for MaxAge goes, the
	// one used since stays.
	c, err = gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git"), MaxAge: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	old, release := tree(a)
	release()
	advance(50 * time.Minute)
	recent, release := tree(b)
	release()
	advance(20 * time.Minute)
	if n := c.Prune(); n != 1 || exists(old) || !exists(recent) {
		t.Errorf("Prune by age removed %d; old there %v, recent there %v", n, exists(old), exists(recent))
	}
	// A pruned tree is fetched again when asked for.
	if again, release := tree(a); again != old || !exists(again) {
		t.Errorf("asked again: %q, there %v", again, exists(again))
	} else {
		release()
	}
}

// A tree's spare (spare.go) is made once per owner, taken by one caller
// only, and pruned with its tree.
func TestSparesAreTakenOnceAndPrunedWithTheirTree(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	commit, url := srv.Commit(t, "app", map[string]string{"f": "aaaa"})
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c, err := gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git"), MaxAge: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tree, release, err := c.Tree(ctx, url, commit, "")
	if err != nil {
		t.Fatal(err)
	}
	fills := 0
	fill := func(_ context.Context, src, dir string) error {
		fills++
		b, err := os.ReadFile(filepath.Join(src, "f"))
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "f"), b, 0o644)
	}
	for range 2 {
		if err := c.MakeSpare(ctx, tree, "self", fill); err != nil {
			t.Fatal(err)
		}
	}
	if fills != 1 {
		t.Errorf("made %d spares for one owner, want 1", fills)
	}
	if _, ok := c.TakeSpare(tree, "1000.1000"); ok {
		t.Error("took another owner's spare")
	}
	dir, ok := c.TakeSpare(tree, "self")
	if !ok {
		t.Fatal("no spare to take")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "aaaa" {
		t.Errorf("the spare's file: %q, %v", b, err)
	}
	if _, ok := c.TakeSpare(tree, "self"); ok {
		t.Error("one spare taken twice")
	}
	c.DropSpare(dir)
	if err := c.MakeSpare(ctx, tree, "self", fill); err != nil {
		t.Fatal(err)
	}
	release()
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	if n := c.Prune(); n != 1 {
		t.Fatalf("Prune removed %d trees, want 1", n)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(tree)), "..", "spares", "*", "*", "*")); len(left) != 0 {
		t.Errorf("spares left after their tree was pruned: %v", left)
	}
}
