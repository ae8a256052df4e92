// Package metricsv1 holds the generated Go code for metrics.v1: a
// process's Prometheus metrics served over a gRPC port it already has.
// Regenerate with `make generate`; CI fails when the committed code is
// stale.
package metricsv1
