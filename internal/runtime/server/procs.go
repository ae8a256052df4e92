package server

// DefaultGOMAXPROCS is the number of threads that run a Runtime Server's
// Go code at once unless the GOMAXPROCS environment variable says
// otherwise. A pod's Go work is relaying (gRPC in, a pipe or a FIFO to
// the worker, gRPC out), a chain of goroutine hand-offs: with a second P
// idle, each hand-off wakes a spinning thread on another CPU, and on a
// small machine those wake-ups cost more than the parallelism gives back
// (docs/benchmarks.md). The programs a pod runs are processes of their
// own and are not bound by it.
const DefaultGOMAXPROCS = 1
