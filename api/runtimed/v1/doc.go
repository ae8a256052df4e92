// Package runtimedv1 holds the generated Go code of runtimed.v1, runtimed's
// own gRPC service on its hop beside executor.v1: the Runs' logs, read by
// the gateway. Regenerate with `make generate`; CI fails when the
// committed code is stale.
package runtimedv1
