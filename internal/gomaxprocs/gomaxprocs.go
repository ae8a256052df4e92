// Package gomaxprocs sets how many threads run a Stoke process's Go code
// at once where its default differs from Go's, leaving the GOMAXPROCS
// environment variable the operator's override.
//
// A Runtime Server's Go work, and much of `stoke up`'s on the warm path,
// is a chain of goroutine hand-offs (HTTP in, gRPC out, gRPC in, HTTP
// out): with a P idle, each hand-off wakes a spinning thread on another
// CPU, and on a small machine those wake-ups cost more than the
// parallelism gives back (docs/benchmarks.md).
package gomaxprocs

import "runtime"

// Apply sets GOMAXPROCS to n (at least 1) unless lookup (os.LookupEnv)
// finds GOMAXPROCS set, in which case the Go runtime has applied it
// already and it stays. It returns the value in effect. Setting it stops
// Go's own updates of the default when the process's CPU limit changes.
func Apply(lookup func(string) (string, bool), n int) int {
	if v, ok := lookup("GOMAXPROCS"); !ok || v == "" {
		runtime.GOMAXPROCS(max(1, n))
	}
	return runtime.GOMAXPROCS(0)
}

// Half is half of Go's default for this process (the CPUs it may use,
// within its cgroup's CPU limit), at least 1: what `stoke up` takes,
// leaving the rest to its pods' Runtime Servers and the programs they
// run. Call it before Apply.
func Half() int {
	return max(1, runtime.GOMAXPROCS(0)/2)
}
