// Package functionset is the Function controller: it keeps each Function's
// replicas, ordinary function Runs with the one-registration contract
// unchanged, at the Function's desired count, and rolls them when the
// Function's template changes, as a Deployment rolls its Pods.
//
// A replica Run carries the label v1alpha1.LabelFunction (the Function's
// name), v1alpha1.LabelTemplateHash (the hash of the template it was made
// from: runtime, handler, source, env, timeout) and a controller owner
// reference to the Function (in Kubernetes the garbage collector deletes
// the replicas of a deleted Function; in standalone this controller does).
// A Run that carries the label without a Function owner is not a replica
// and is left alone.
//
// The desired count is spec.replicas (what the scale subresource, `kubectl
// scale` and the autoscaler write), or scale.min when unset, clamped to
// [scale.min, scale.max]. On every sync of a Function the controller
//   - deletes replicas that ended (a terminal Run is a dead registration)
//     and creates new ones in their place, backing off when replicas keep
//     dying (1 s doubling to bounds.MaxBackoff, reset by a Ready replica);
//   - creates replicas of the current template up to the desired count;
//   - marks draining (v1alpha1.AnnotationDraining) the replicas that are
//     too many, and the old template's as soon as the current template's
//     Ready replicas cover the desired count without them: the gateway's
//     dispatcher sends a draining replica nothing new;
//   - deletes a draining replica drainSeconds after it was marked (the
//     time is in v1alpha1.AnnotationDrainingSince), or earlier when the
//     optional Drained hook says no dispatcher has an invocation on it;
//     the Run's own delete then drains its registration (runtimed lets
//     the invocation in flight end before it unregisters);
//   - writes status: replicas, readyReplicas, updatedReplicas, the
//     selector, the template hash, observedGeneration, a
//     ReplicaFailure condition naming the last replica that died, and
//     lastScale, the autoscaler's last decision ([Controller.Record]),
//     in one write StatusDelay after the first change it carries.
//
// It knows only the store interface and the informers, so it runs the same
// in standalone (stoke up) and in the Kubernetes controller. It is written
// on the control plane's loop kit (internal/loop): one goroutine decides,
// keyed by Function.
package functionset
