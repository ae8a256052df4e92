// Package executorv1 holds the generated Go code for the Pod-local
// executor.v1 gRPC contract: the one-shot Runtime service and the optional
// FunctionRuntime service. Regenerate with `make generate`; CI fails when
// the committed code is stale.
package executorv1
