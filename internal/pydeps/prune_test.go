package pydeps_test

import (
	"os"
	"testing"
	"time"

	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
)

// The cache is pruned by age and by size, never of a directory a
// registration holds (Use) nor of one used within the longest task's
// time; a pruned digest is installed again on its next use.
func TestPruneKeepsWhatIsInUse(t *testing.T) {
	links, root := wheels(t), t.TempDir()
	if _, err := pydepstest.Wheel(links, "otherdep", "1.0", "VALUE = 2\n"); err != nil {
		t.Fatal(err)
	}
	c, err := pydeps.New(pydeps.Config{Root: root, FindLinks: links, MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	held, release, err := c.Use(ctx(t), source(t, "tinydep==1.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	free, err := c.Dir(ctx(t), source(t, "otherdep==1.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }

	// Over MaxBytes (1 byte), but both were used just now: a task may be
	// using the one not held.
	if n, _, err := c.Prune(time.Now()); err != nil || n != 0 {
		t.Fatalf("prune right after use: %d removed, %v; want none", n, err)
	}
	// Past the longest task's time: the one not held goes, the held one
	// stays however old and however large the cache.
	later := time.Now().Add(8 * 24 * time.Hour)
	n, freed, err := c.Prune(later)
	if err != nil || n != 1 || freed <= 0 || exists(free) || !exists(held) {
		t.Fatalf("prune a week later: %d removed (%d bytes), %v; %s exists %v (want gone), %s exists %v (held: want kept)",
			n, freed, err, free, exists(free), held, exists(held))
	}
	release()
	if n, _, err := c.Prune(later); err != nil || n != 1 || exists(held) {
		t.Fatalf("prune after release: %d removed, %v; %s exists %v", n, err, held, exists(held))
	}
	// Used again: installed again.
	before := c.Installs()
	again, release, err := c.Use(ctx(t), source(t, "tinydep==1.0\n"))
	defer release()
	if err != nil || again != held || !exists(again) || c.Installs() != before+1 {
		t.Fatalf("use after prune: %q, %v, installs %d -> %d", again, err, before, c.Installs())
	}
}
