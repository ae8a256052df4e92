package server

import "runtime"

// DefaultGOMAXPROCS is the number of threads that run a Runtime Server's
// Go code at once unless the GOMAXPROCS environment variable says
// otherwise. A pod's Go work is relaying (gRPC in, a pipe or a FIFO to
// the worker, gRPC out), a chain of goroutine hand-offs: with a second P
// idle, each hand-off wakes a spinning thread on another CPU, and on a
// small machine those wake-ups cost more than the parallelism gives back
// (docs/benchmarks.md). The programs a pod runs are processes of their
// own and are not bound by it.
const DefaultGOMAXPROCS = 1

// SetGOMAXPROCS applies DefaultGOMAXPROCS to this process unless lookup
// (os.LookupEnv) finds GOMAXPROCS set, in which case the Go runtime has
// already applied it and it stays the override. It returns the value in
// effect. Only a process that is a Runtime Server calls it (`stoke
// runtime-server`), never a program that serves one among other work.
func SetGOMAXPROCS(lookup func(string) (string, bool)) int {
	if v, ok := lookup("GOMAXPROCS"); !ok || v == "" {
		runtime.GOMAXPROCS(DefaultGOMAXPROCS)
	}
	return runtime.GOMAXPROCS(0)
}
