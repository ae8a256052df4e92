// Package loop is the control plane's one loop kit: the mechanism under
// the scheduler, the reaper, the Kubernetes pod source and the
// autoscaler, so that each of them holds only its decisions.
//
// A [Loop] has
//   - a key queue ([Queue]): informer handlers and other goroutines Add
//     keys without blocking, a key already waiting is not added twice,
//     and keys come out in the order they were first added; the loop
//     reads each key's current state itself (level-triggered), so
//     collapsing duplicates loses nothing;
//   - a timer heap keyed by key ([Timers]): a key is due at most once,
//     at the earliest time it was armed for (or the time it was Set to),
//     and one timer of the injected clock is armed for the earliest key,
//     so that a fake clock (k8s.io/utils/clock/testing) drives it;
//   - an optional stream of events (pod transitions) the loop reacts to;
//   - a bounded pool of workers for slow writes: [Loop.Submit] hands them
//     a function, and its result comes back to the loop goroutine through
//     [Hooks.Result], so that deciding never waits for a store and every
//     decision is still made on one goroutine.
//
// [Loop.Run] blocks until its context ends and owns every goroutine it
// starts: when it returns, the workers have finished.
//
// The hooks and the methods that touch the timers or submit work ([Loop.After],
// [Loop.Set], [Loop.Stop], [Loop.Submit], [Loop.SyncQueued]) run on the
// goroutine that calls Run (before Run, or from a hook); only [Loop.Add]
// may be called from any goroutine.
//
// The kit knows nothing of Runs, stores, processes or Kubernetes clients:
// keys are any comparable type, and a component that watches several kinds
// tags its keys with the kind.
package loop
