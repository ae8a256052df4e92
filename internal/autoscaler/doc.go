// Package autoscaler sets how many replicas each Function wants: one
// control loop beside the scheduler and the reaper, written on the loop
// kit (internal/loop), whose only output is a Function's desired count.
//
// For each Function it samples the load, in-flight plus queued
// invocations, from Config.Load (standalone: the gateway's dispatcher) or,
// when that is nil, from the Function's status.inFlight and status.queued
// (Kubernetes: what the gateways report). The load it acts on is the
// peak of its samples over Config.Window, so a dip between two
// invocations does not read as idle. Wanted replicas are
// ceil(load / scale.targetInFlight) within [scale.min, scale.max]:
//
//   - more than the current count: the count goes up at once, so the
//     first queued invocation of an idle Function (min 0) gets a replica
//     as soon as the dispatcher says so ([Autoscaler.Poke]) or the next
//     sample is taken;
//   - fewer: only once the wanted count has stayed below the current one
//     for scale.idleSeconds without a break, and then to the largest count
//     wanted during that time, never below what is in flight now
//     (ceil(inFlight / targetInFlight)): a stable scale-down;
//   - a Function whose load and replicas are at rest is not sampled.
//
// The desired count is written to spec.replicas, the scale subresource's
// desired count that `kubectl scale` and HPA-style tools set too; the
// Function controller (internal/functionset) creates and deletes replica
// Runs to match it, and no other field is the autoscaler's. The decision,
// when, from what, to what and why, goes to Config.Record once written
// (the Function controller's Record), which puts it in status.lastScale
// with its own next status write: one status write a short while after a
// scale from zero, not one beside its path. Each decision is made on the
// loop's goroutine from the informer's copy; the write goes to the loop's
// workers on the informer's copy the decision was made on (no read
// before it: a scale from zero waits for it; a stale copy is a conflict,
// retried on a fresh read), and the Function is not decided again until
// the informer shows the write.
package autoscaler
