package pydeps_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A registration that waited for another's install goes on once the
// directory is there, although the registrations already using it hold
// the digest's lock shared for as long as they live (a waiter that asked
// for it exclusively again waited for all of them: CI saw 7 of 8
// concurrent registrations fail at their initialisation timeout).
func TestWaiterGoesOnWhenTheInstallIsThere(t *testing.T) {
	links := wheels(t)
	installed, err := newCache(t, t.TempDir(), links).Dir(ctx(t), source(t, "tinydep==1.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	digest := filepath.Base(installed)

	// Another cache root, as if its install were under way: its lock held
	// exclusively by the "installer".
	root := t.TempDir()
	c := newCache(t, root, links)
	lockPath := filepath.Join(root, "."+digest+".lock")
	installer, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer installer.Close()
	if err := unix.Flock(int(installer.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	type result struct {
		dir string
		err error
	}
	done := make(chan result, 1)
	waitCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src := source(t, "tinydep==1.0\n")
	go func() {
		dir, release, err := c.Use(waitCtx, src)
		release()
		done <- result{dir, err}
	}()
	// The waiter has looked for the directory (not there) and opened the
	// lock file to wait: the process then holds two descriptors of it.
	for openCount(t, lockPath) < 2 {
		select {
		case r := <-done:
			t.Fatalf("Use returned before the install finished: %q, %v", r.dir, r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}

	// The install finishes and a registration uses it: the lock goes from
	// exclusive to shared and stays held.
	if err := os.CopyFS(filepath.Join(root, digest), os.DirFS(installed)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(installer.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	if r.dir != filepath.Join(root, digest) {
		t.Errorf("the waiter got %q, want %q", r.dir, filepath.Join(root, digest))
	}
}

// openCount is how many of this process's descriptors refer to path.
func openCount(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}
