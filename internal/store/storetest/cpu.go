package storetest

import (
	"syscall"
	"testing"
	"time"
)

// CPUPerOp starts measuring the process's CPU time (user + system, every
// goroutine, the watcher's included); the function it returns reports it
// per operation. Unlike ns/op it does not grow when other processes
// compete for the machine's two cores. Use: defer storetest.CPUPerOp(b)().
func CPUPerOp(b *testing.B) func() {
	b.ReportAllocs()
	start := cpuTime(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
