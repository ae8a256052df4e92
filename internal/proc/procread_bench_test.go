package proc

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkProcRead is what the looks a Runtime Server makes after every
// call cost on this machine, beside the cheapest system call: a read of
// an empty children file (the worker's, the Subreaper's), an fstat of a
// task directory (the child scan's thread count), and two files that
// would tell whether anything was created since a look (the last pid in
// /proc/loadavg and /proc/sys/kernel/ns_last_pid), which cost more than
// the looks they would save (docs/benchmarks.md).
func BenchmarkProcRead(b *testing.B) {
	self := strconv.Itoa(os.Getpid())
	for _, c := range []struct{ name, path string }{
		{"children", "/proc/" + self + "/task/" + self + "/children"},
		{"loadavg", "/proc/loadavg"},
		{"ns_last_pid", "/proc/sys/kernel/ns_last_pid"},
	} {
		b.Run(c.name, func(b *testing.B) {
			fd, err := unix.Open(c.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatalf("%s: %v", c.path, err)
			}
			defer unix.Close(fd)
			var buf [128]byte
			for b.Loop() {
				if _, err := unix.Pread(fd, buf[:], 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("fstat-task", func(b *testing.B) {
		fd, err := unix.Open("/proc/self/task", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		for b.Loop() {
			if err := unix.Fstat(fd, &st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("getppid", func(b *testing.B) {
		for b.Loop() {
			unix.Getppid()
		}
	})
}
