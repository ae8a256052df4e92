package bootstrap

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestChangesWithinTheCopysTick: a file rewritten at the same size within
// the file system clock's tick of its copy can show the times and size
// of the record; one recorded at or after the tick is compared by content
// with the package's original, so such a change is still sent, and a
// file rewritten with its own content is not. Removals are listed once
// per removed directory.
func TestChangesWithinTheCopysTick(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "task")
	for name, content := range map[string]string{"same.txt": "aaaa", "changed.txt": "bbbb", "gone/a": "a", "gone/deep/b": "b", "bootstrap": "not copied"} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rec := &record{src: src, entries: map[string]state{}}
	if err := copyTree(src, dst, rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.entries["bootstrap"]; ok {
		t.Fatal("the bootstrap was copied")
	}
	for name, content := range map[string]string{"same.txt": "aaaa", "changed.txt": "BBBB"} {
		p := filepath.Join(dst, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// As if the rewrite fell within the tick: the record cannot
		// tell it by its times.
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		rec.entries[name] = stateOf(fi)
	}
	if err := os.RemoveAll(filepath.Join(dst, "gone")); err != nil {
		t.Fatal(err)
	}
	rec.tick = syscall.Timespec{} // every entry is at or after it
	send, deleted, unchanged, err := rec.changes(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(send, []string{"changed.txt"}) || !slices.Equal(deleted, []string{"gone"}) || unchanged != 1 {
		t.Fatalf("send %q, deleted %q, unchanged %d; want changed.txt, gone, 1", send, deleted, unchanged)
	}
}
