// Package validation is the one place that decides whether a Run or a
// Runtime (stoke.dev/v1alpha1) is acceptable. Every entry point — the CLI,
// the gateway, the standalone store, the Kubernetes webhook — calls it, so a
// rule is stated once.
//
// Defaulting is separate from validation, as in Kubernetes: an entry point
// calls [SetRunDefaults] (or [SetRuntimeDefaults]) on a new object and then
// [ValidateRun] (or [ValidateRuntime]); on an update it calls
// [ValidateRunUpdate] (or [ValidateRuntimeUpdate]) with the stored object.
//
// A validator returns nil or every problem it found, joined with
// errors.Join. Each problem is an errdefs.ErrInvalidArgument whose message
// starts with a Kubernetes-style field path ("spec.mode.task.args[3]: ..."),
// so errors.Is(err, errdefs.ErrInvalidArgument) holds for the whole and the
// edge maps it to gRPC InvalidArgument / HTTP 400. At most [MaxErrors]
// problems are listed; the rest are counted.
//
// Size limits come from internal/bounds. Checks that need a Runtime Server
// (does the handler's file exist, does the server implement functions) are
// not made here: they happen when runtimed registers or executes the Run.
package validation
