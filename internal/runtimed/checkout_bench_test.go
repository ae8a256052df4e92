package runtimed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// BenchmarkGitCheckout is the checkout of a cached commit (issue 22's
// target: ≤ 5 ms) into a new working directory, as runtimed does it for a
// Run's source.git — a tree of 200 files of 4 KiB in 20 directories —
// beside its floor: `cp -r` of the same tree, measured alternately in the
// same run. Both start from the tree in the git cache. checkout is with
// the spare made after the previous checkout (spares.go; the benchmark
// waits for it, off the clock, as a Run's next checkout would find it);
// copy is a checkout with no spare (the first of a commit on a pod).
func BenchmarkGitCheckout(b *testing.B) {
	srv := gittest.NewServer(b, gittest.Options{})
	files := map[string]string{}
	for i := range 200 {
		files[fmt.Sprintf("dir%02d/file%03d.txt", i%20, i)] = strings.Repeat(fmt.Sprintf("%03d ", i), 1024)
	}
	commit, url := srv.Commit(b, "bench", files)
	cache, err := gitsource.New(gitsource.Config{Dir: filepath.Join(b.TempDir(), "git")})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tree, release, err := cache.Tree(ctx, url, commit, "")
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	src := &v1alpha1.Source{Git: &v1alpha1.GitSource{URL: url, Commit: commit}}
	fetch := func(ctx context.Context, g *v1alpha1.GitSource) (string, func(), error) {
		return cache.Tree(ctx, g.URL, g.Commit, "")
	}
	sp := newSpares(ctx, cache, nil)
	defer sp.close()
	work := b.TempDir()
	// The first checkout copies, and makes the first spare.
	if err := materialise(ctx, nil, filepath.Join(work, "first"), false, src, fetch, sp); err != nil {
		b.Fatal(err)
	}
	sp.idle()
	var checkout, cp, cpy []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(work, fmt.Sprintf("c%d", i))
		start := time.Now()
		if err := materialise(ctx, nil, dir, false, src, fetch, sp); err != nil {
			b.Fatal(err)
		}
		checkout = append(checkout, time.Since(start))
		floor := filepath.Join(work, fmt.Sprintf("f%d", i))
		start = time.Now()
		if out, err := exec.Command("cp", "-r", tree, floor).CombinedOutput(); err != nil {
			b.Fatalf("cp -r: %v: %s", err, out)
		}
		cp = append(cp, time.Since(start))
		copied := filepath.Join(work, fmt.Sprintf("k%d", i))
		start = time.Now()
		if err := materialise(ctx, nil, copied, false, src, fetch, nil); err != nil {
			b.Fatal(err)
		}
		cpy = append(cpy, time.Since(start))
		b.StopTimer()
		sp.idle()
		for _, d := range []string{dir, floor, copied} {
			if err := os.RemoveAll(d); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(p50ms(checkout), "checkout-p50-ms")
	b.ReportMetric(p50ms(cpy), "copy-checkout-p50-ms")
	b.ReportMetric(p50ms(cp), "cp-r-p50-ms")
	b.ReportMetric(0, "ns/op")
}

func p50ms(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
