package cacheprune

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// entry makes a cached directory of n bytes last used at used.
func entry(t *testing.T, root, key string, n int, used time.Time) Entry {
	t.Helper()
	dir := filepath.Join(root, key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	return Entry{Key: key, Dir: dir, Lock: filepath.Join(root, "."+key+".lock"), LastUse: used, Bytes: DirSize(dir)}
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// The policy's edges: older than MaxAge goes; over MaxBytes, the least
// recently used go first (ties by key) until the rest fit; never one used
// less than MinAge ago, never one whose lock is held.
func TestPrune(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	p := Policy{MaxBytes: 250, MaxAge: time.Hour, MinAge: time.Minute}
	for _, tc := range []struct {
		name  string
		ages  map[string]time.Duration // key -> age; each entry 100 bytes
		held  string
		bytes int64
		gone  []string
	}{
		{name: "within bounds", ages: map[string]time.Duration{"a": 2 * time.Minute, "b": 3 * time.Minute}, bytes: 250},
		{name: "exactly MaxAge stays", ages: map[string]time.Duration{"a": time.Hour}, bytes: 250},
		{name: "older than MaxAge goes", ages: map[string]time.Duration{"a": time.Hour + time.Second, "b": time.Minute + time.Second}, bytes: 250, gone: []string{"a"}},
		{name: "over size: least recent first", ages: map[string]time.Duration{"a": 5 * time.Minute, "b": 10 * time.Minute, "c": 7 * time.Minute}, bytes: 250, gone: []string{"b"}},
		{name: "over size: ties by key", ages: map[string]time.Duration{"b": 5 * time.Minute, "a": 5 * time.Minute, "c": 5 * time.Minute}, bytes: 250, gone: []string{"a"}},
		{name: "within MinAge stays over size", ages: map[string]time.Duration{"a": 50 * time.Second, "b": 30 * time.Second, "c": 10 * time.Second}, bytes: 250},
		{name: "exactly MinAge goes over size", ages: map[string]time.Duration{"a": time.Minute, "b": 30 * time.Second, "c": 10 * time.Second}, bytes: 250, gone: []string{"a"}},
		{name: "held stays, the next goes", ages: map[string]time.Duration{"a": 5 * time.Minute, "b": 10 * time.Minute, "c": 7 * time.Minute}, held: "b", bytes: 250, gone: []string{"c"}},
		{name: "size bound 0 empties what is not recent", ages: map[string]time.Duration{"a": 5 * time.Minute, "b": 30 * time.Second}, bytes: 0, gone: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			var es []Entry
			for k, age := range tc.ages {
				es = append(es, entry(t, root, k, 100, now.Add(-age)))
			}
			if tc.held != "" {
				f, err := os.OpenFile(filepath.Join(root, "."+tc.held+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
					t.Fatal(err)
				}
			}
			pol := p
			pol.MaxBytes = tc.bytes
			pol.Trash = root
			res, err := Prune(es, pol, now)
			if err != nil {
				t.Fatal(err)
			}
			var gone []string
			for _, e := range res.Gone {
				gone = append(gone, e.Key)
			}
			if len(gone) != len(tc.gone) || (len(gone) > 0 && gone[0] != tc.gone[0]) {
				t.Fatalf("gone %v, want %v", gone, tc.gone)
			}
			if res.Removed != len(tc.gone) || res.Freed != int64(100*len(tc.gone)) || res.Left != int64(100*(len(tc.ages)-len(tc.gone))) {
				t.Errorf("result %+v for %d gone of %d", res, len(tc.gone), len(tc.ages))
			}
			for k := range tc.ages {
				want := true
				for _, g := range tc.gone {
					want = want && g != k
				}
				if exists(filepath.Join(root, k)) != want {
					t.Errorf("%s exists %v, want %v", k, !want, want)
				}
			}
			// Nothing left in the trash.
			left, _ := filepath.Glob(filepath.Join(root, ".prune-*"))
			if len(left) != 0 {
				t.Errorf("left in the trash: %v", left)
			}
		})
	}
}
