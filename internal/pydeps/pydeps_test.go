package pydeps_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
)

// wheels is a directory with the wheel tinydep 1.0.
func wheels(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := pydepstest.Wheel(dir, "tinydep", "1.0", "VALUE = 'from tinydep'\n"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func source(t testing.TB, requirements string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pydeps.File), []byte(requirements), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newCache(t testing.TB, root, links string) *pydeps.Cache {
	t.Helper()
	c, err := pydeps.New(pydeps.Config{Root: root, FindLinks: links})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// A requirements.txt is installed from the wheel directory alone, and the
// module imports from the directory Dir returns; the same requirements
// again (another source, another Cache on the same directory, as another
// Runtime Server's) install nothing.
func TestInstallsOnceAndImports(t *testing.T) {
	links, root := wheels(t), t.TempDir()
	c := newCache(t, root, links)
	dir, err := c.Dir(ctx(t), source(t, "tinydep==1.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", "import tinydep; print(tinydep.VALUE)")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir)
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "from tinydep" {
		t.Fatalf("import from %s: %v: %s", dir, err, out)
	}
	other := newCache(t, root, links)
	again, err := other.Dir(ctx(t), source(t, "tinydep==1.0\n"))
	if err != nil || again != dir {
		t.Fatalf("the same requirements again: %q, %v; want %s", again, err, dir)
	}
	if c.Installs() != 1 || other.Installs() != 0 {
		t.Fatalf("installs: %d and %d; want 1 and 0", c.Installs(), other.Installs())
	}
	if none, err := c.Dir(ctx(t), t.TempDir()); none != "" || err != nil {
		t.Fatalf("a source without requirements: %q, %v; want nothing", none, err)
	}
}

// Concurrent first registrations with the same requirements, through two
// Caches on one directory (two Runtime Servers), install once; each gets
// the complete directory.
func TestConcurrentFirstInstallsOnce(t *testing.T) {
	links, root := wheels(t), t.TempDir()
	caches := []*pydeps.Cache{newCache(t, root, links), newCache(t, root, links)}
	var wg sync.WaitGroup
	dirs := make([]string, 8)
	errs := make([]error, 8)
	for i := range dirs {
		wg.Go(func() {
			dirs[i], errs[i] = caches[i%2].Dir(ctx(t), source(t, "tinydep==1.0\n"))
		})
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("registration %d: %q, %v; want %s", i, dirs[i], errs[i], dirs[0])
		}
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "tinydep", "__init__.py")); err != nil {
		t.Fatal(err)
	}
	if n := caches[0].Installs() + caches[1].Installs(); n != 1 {
		t.Fatalf("%d installs; want 1", n)
	}
}

// A requirement pip cannot install fails with pip's message, and leaves
// nothing in the cache: the next attempt installs again.
func TestInstallErrorCarriesPipsMessage(t *testing.T) {
	links, root := wheels(t), t.TempDir()
	c := newCache(t, root, links)
	_, err := c.Dir(ctx(t), source(t, "nosuchdep==2.0\n"))
	if err == nil || !strings.Contains(err.Error(), "No matching distribution found for nosuchdep==2.0") || len(err.Error()) > 8<<10 {
		t.Fatalf("err = %v; want pip's message, bounded", err)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() {
			t.Fatalf("the failed install left %s in the cache", e.Name())
		}
	}
	if _, err := c.Dir(ctx(t), source(t, "nosuchdep==2.0\n")); err == nil || c.Installs() != 2 {
		t.Fatalf("a second attempt: %v after %d installs; want it to try again", err, c.Installs())
	}
}

// BenchmarkDirInstalled: what the cache adds to a registration whose
// requirements are installed (read, digest, one stat), p50 in µs.
func BenchmarkDirInstalled(b *testing.B) {
	c := newCache(b, b.TempDir(), wheels(b))
	src := source(b, "tinydep==1.0\n")
	if _, err := c.Dir(ctx(b), src); err != nil {
		b.Fatal(err)
	}
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := c.Dir(context.Background(), src); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1000, "p50-us")
	if c.Installs() != 1 {
		b.Fatalf("%d installs; want 1", c.Installs())
	}
}
