package up

import "runtime/debug"

// GCPercent is stoke up's garbage collection target (GOGC) when the
// environment sets none. stoke up keeps a far larger live heap than the
// garbage a warm invocation makes (the store's cache, the informers, the
// pools), and at Go's default of 100 that garbage pays for marking the
// whole heap again every time it reaches the heap's size: a higher
// target makes collections rarer, for a heap that may grow to about
// (1 + GCPercent/100) times the live one (docs/benchmarks.md, "Warm
// invoke: stoke up's CPU per call"). GOGC in the environment wins
// (GOGC=100 is Go's default, GOGC=off turns collection off), and
// GOMEMLIMIT bounds the heap as Go documents.
const GCPercent = 400

// SetGC sets the process's garbage collection target to GCPercent unless
// GOGC is set (lookupEnv is os.LookupEnv outside tests), and says whether
// it did. Only stoke up's own process calls it: its pods are processes
// of their own, with Go's default.
func SetGC(lookupEnv func(string) (string, bool)) bool {
	if _, set := lookupEnv("GOGC"); set {
		return false
	}
	debug.SetGCPercent(GCPercent)
	return true
}
