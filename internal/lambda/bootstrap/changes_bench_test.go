package bootstrap

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkHoldCopyAndList: the sandbox's own part of a write-back step,
// over the workspace of the lambda package's BenchmarkTaskWriteBack (200
// files of 16 KiB): the copy of the package into the task's directory
// with its record (before the task), and the listing of what the task
// changed (one new file of 64 KiB) after it; p50 of each.
func BenchmarkHoldCopyAndList(b *testing.B) {
	src := b.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "src"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range 200 {
		content := strings.Repeat(fmt.Sprintf("%07d\n", i), 2048)
		if err := os.WriteFile(filepath.Join(src, "src", fmt.Sprintf("f%03d.txt", i)), []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var copies, lists []time.Duration
	for i := range b.N {
		dst := filepath.Join(b.TempDir(), fmt.Sprint(i))
		start := time.Now()
		rec := &record{src: src, entries: map[string]state{}}
		if err := copyTree(src, dst, rec); err != nil {
			b.Fatal(err)
		}
		probe := dst + ".changes"
		if err := os.WriteFile(probe, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := rec.seal(probe); err != nil {
			b.Fatal(err)
		}
		copies = append(copies, time.Since(start))
		if err := os.WriteFile(filepath.Join(dst, "out.bin"), make([]byte, 64<<10), 0o644); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		send, deleted, _, err := rec.changes(dst)
		lists = append(lists, time.Since(start))
		if err != nil || len(deleted) != 0 || !slices.Contains(send, "out.bin") {
			b.Fatalf("send %q deleted %q: %v", send, deleted, err)
		}
		b.ReportMetric(float64(len(send)), "sent")
	}
	b.ReportMetric(p50ms(copies), "copy-p50-ms")
	b.ReportMetric(p50ms(lists), "list-p50-ms")
}

func p50ms(d []time.Duration) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
