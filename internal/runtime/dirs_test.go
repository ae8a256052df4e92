package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"stoke.dev/stoke/internal/bounds"
)

func TestMakeDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a")
	if err := MakeDir(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, %v; want a 0700 directory", fi, err)
	}
	if err := MakeDir(dir); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second MakeDir: %v, want fs.ErrExist", err)
	}
	deep := filepath.Join(root, "b", "c", "d")
	if err := MakeDir(deep); err != nil {
		t.Fatalf("missing parents: %v", err)
	}
	if fi, err := os.Stat(deep); err != nil || !fi.IsDir() {
		t.Fatalf("made %v, %v", fi, err)
	}
}

func TestRemoveDir(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	full := filepath.Join(root, "full")
	for _, p := range []string{empty, filepath.Join(full, "sub", "deeper")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(full, "sub", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{empty, full, filepath.Join(root, "missing")} {
		if err := RemoveDir(p); err != nil {
			t.Fatalf("RemoveDir(%s): %v", p, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s still there: %v", p, err)
		}
	}
}

func TestRemoveScratch(t *testing.T) {
	root := t.TempDir()
	pool, err := NewDirPool(filepath.Join(root, scratchPool), scratchTmp)
	if err != nil {
		t.Fatal(err)
	}
	tasks := &Tasks{scratch: pool}
	for _, tc := range []struct {
		extra  string // a file made in the scratch directory
		left   bool   // a file left in tmp
		pooled bool
	}{
		{"", false, true},
		{"outputs", false, true}, // the outputs file goes by name
		{"other", false, false},
		{"", true, false},
	} {
		scratch := filepath.Join(root, "task_x")
		if err := pool.Make(scratch); err != nil {
			t.Fatal(err)
		}
		if tc.extra != "" {
			if err := os.WriteFile(filepath.Join(scratch, tc.extra), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if tc.left {
			if err := os.WriteFile(filepath.Join(scratch, scratchTmp, "left"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := tasks.removeScratch(scratch); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(scratch); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%+v: scratch still there: %v", tc, err)
		}
		if n := len(pool.free); (n == 1) != tc.pooled {
			t.Fatalf("%+v: %d pooled", tc, n)
		}
		pool.free = nil
		if err := os.RemoveAll(pool.root); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(pool.root, 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

// A directory that comes back empty is handed out again, the same inode,
// with its inner directories and nothing else; one that does not is
// removed; the pool never holds more than its bound, and a new pool
// starts empty.
func TestDirPool(t *testing.T) {
	root := t.TempDir()
	poolDir := filepath.Join(root, ".pool")
	if err := os.MkdirAll(filepath.Join(poolDir, "stale", "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	pool, err := NewDirPool(poolDir, "tmp")
	if err != nil {
		t.Fatal(err)
	}
	if names, _ := readNames(poolDir, -1); len(names) != 0 {
		t.Fatalf("a new pool holds %v", names)
	}
	a := filepath.Join(root, "a")
	if err := pool.Make(a); err != nil {
		t.Fatal(err)
	}
	first, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	if first.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v, want 0700", first.Mode().Perm())
	}
	if err := pool.Make(a); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Make of an existing directory: %v, want fs.ErrExist", err)
	}
	if err := pool.Remove(a); err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(root, "b")
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	// The pooled directory is not put over an existing one, and stays
	// pooled.
	if err := pool.Make(b); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Make over an existing directory: %v, want fs.ErrExist", err)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := pool.Make(b); err != nil {
		t.Fatal(err)
	}
	again, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(first, again) {
		t.Fatal("an emptied directory was not handed out again")
	}
	if names, _ := readNames(b, -1); len(names) != 1 || names[0] != "tmp" {
		t.Fatalf("a reused directory holds %v, want [tmp]", names)
	}

	// Left with something in it: removed, and the next one is new.
	if err := os.WriteFile(filepath.Join(b, "tmp", "left"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pool.Remove(b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(b); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a directory with a file left is still there: %v", err)
	}
	if len(pool.free) != 0 {
		t.Fatalf("a directory with a file left was pooled")
	}
	// Opened to others: removed, not handed to the next execution.
	if err := pool.Make(b); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(b, "tmp"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := pool.Remove(b); err != nil {
		t.Fatal(err)
	}
	if len(pool.free) != 0 {
		t.Fatalf("a directory opened to others was pooled")
	}
	if err := pool.Remove(filepath.Join(root, "missing")); err != nil {
		t.Fatalf("Remove of a missing directory: %v", err)
	}

	// The bound.
	for i := range bounds.DirPool + 3 {
		d := filepath.Join(root, fmt.Sprintf("d%d", i))
		if err := pool.Make(d); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := pool.Remove(d); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() {
		if names, _ := readNames(poolDir, -1); len(names) != bounds.DirPool {
			t.Errorf("the pool holds %d directories, want its bound %d", len(names), bounds.DirPool)
		}
	})
}

// The fast path of Resolve answers exactly as the general one: a symlink
// below the root, even to a directory inside it, is followed and checked.
func TestWorkspaceResolveBelowRoot(t *testing.T) {
	root := t.TempDir()
	w, err := NewWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	root = w.Root()
	outside := t.TempDir()
	for _, p := range []string{"a/b", "in"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "a", "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "in"), filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir, want string // want "" is refused
	}{
		{root + "/a/b", root + "/a/b"},
		{root, root},
		{root + "/a/link", root + "/in"},
		{root + "/a/out", ""},
		{root + "/a/out/x", ""},
		{root + "/file", ""},
		{root + "/missing", ""},
		{root + "/a/../a/b", root + "/a/b"},
		{outside, ""},
	}
	for _, tc := range tests {
		got, err := w.Resolve("working_dir", tc.dir)
		if tc.want == "" {
			if err == nil {
				t.Errorf("Resolve(%s) = %s, want refused", tc.dir, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tc.dir, got, err, tc.want)
		}
	}
}

// BenchmarkScratchDirs is the file-system work of one short task: its
// scratch directory (with tmp) made and removed, and one file created
// beside it (the Run's log, which lives on): made and removed each time
// ("mkdir"), or from and back to a DirPool ("pool"). On ext4 every inode
// freed makes the next allocations in its block group dearer for a few
// seconds, which is what the file's create shows.
func BenchmarkScratchDirs(b *testing.B) {
	for _, pooled := range []bool{false, true} {
		name := "mkdir"
		if pooled {
			name = "pool"
		}
		b.Run(name, func(b *testing.B) {
			root := b.TempDir()
			logs := filepath.Join(root, "logs")
			if err := os.Mkdir(logs, 0o700); err != nil {
				b.Fatal(err)
			}
			pool, err := NewDirPool(filepath.Join(root, ".pool"), scratchTmp)
			if err != nil {
				b.Fatal(err)
			}
			tasks := &Tasks{scratch: pool}
			var cpu syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu)
			start := cpu.Utime.Nano() + cpu.Stime.Nano()
			i := 0
			for b.Loop() {
				scratch := filepath.Join(root, fmt.Sprintf("task_%d", i))
				if pooled {
					if err := pool.Make(scratch); err != nil {
						b.Fatal(err)
					}
				} else if err := MakeDir(scratch); err != nil || MakeDir(filepath.Join(scratch, scratchTmp)) != nil {
					b.Fatal(err)
				}
				f, err := os.OpenFile(filepath.Join(logs, fmt.Sprintf("run-%d", i)), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
				if err != nil {
					b.Fatal(err)
				}
				_ = f.Close()
				if pooled {
					err = tasks.removeScratch(scratch)
				} else {
					_ = syscall.Rmdir(filepath.Join(scratch, scratchTmp))
					err = RemoveDir(scratch)
				}
				if err != nil {
					b.Fatal(err)
				}
				i++
			}
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu)
			b.ReportMetric(float64(cpu.Utime.Nano()+cpu.Stime.Nano()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// A directory that a root server handed to the Runs' user comes back to
// the pool as the server's own (its inner directories too), so that the
// next execution's directory is the server's until it is handed over
// afresh and the user can add nothing to it meanwhile. Only root can
// hand a directory over; otherwise the directories are ours throughout.
func TestDirPoolTakesHandedOverDirectoriesBack(t *testing.T) {
	root := t.TempDir()
	pool, err := NewDirPool(filepath.Join(root, ".pool"), "tmp")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dir := filepath.Join(root, "a")
	if err := pool.Make(dir); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		for _, d := range []string{filepath.Join(dir, "tmp"), dir} {
			if err := os.Chown(d, 65533, 65533); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := pool.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if len(pool.free) != 1 {
		t.Fatalf("the emptied directory was not kept (%d kept)", len(pool.free))
	}
	again := filepath.Join(root, "b")
	if err := pool.Make(again); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{again, filepath.Join(again, "tmp")} {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != os.Geteuid() {
			t.Errorf("%s from the pool belongs to uid %d, not to the server (%d)", d, st.Uid, os.Geteuid())
		}
	}
}
