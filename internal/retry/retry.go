// Package retry is Stoke's one retry engine, shared by runtimed (a failed
// execution or registration) and the stale-run reaper (a vanished pod). It
// decides, from a Run's spec.retryPolicy and status.attempt, whether a
// failure gets another attempt and when, or which terminal phase the Run
// ends in.
//
// [Decide] is pure: no I/O, and the clock is passed in. [Apply] writes a
// [Decision] into the Run's status; the caller persists it with its usual
// optimistic-concurrency status update. Only a failure before or outside an
// invocation reaches the engine: invocation failures never change a Run's
// phase and never use an attempt, and nothing is retried after dispatch.
package retry

import (
	"fmt"
	"slices"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// Reason is a machine-readable failure reason, written to status.reason and
// matched against spec.retryPolicy.retryableReasons.
type Reason string

// Reasons retried by default (see [DefaultRetryableReasons]): the failure
// lies with the infrastructure, not with the Run.
const (
	// RuntimeExecute: the Runtime Server's Execute call for a task failed
	// (the server refused or was unreachable); the task's own exit status is
	// NonZeroExit, not this.
	RuntimeExecute Reason = "RuntimeExecute"
	// RegistrationFailed: a function's registration or handler load failed.
	RegistrationFailed Reason = "RegistrationFailed"
	// ExecutionLost: the Runtime Server no longer knows the execution or
	// registration (it restarted), so its outcome is unknown.
	ExecutionLost Reason = "ExecutionLost"
	// PodGone: the assigned pod vanished or stopped heart-beating and was
	// fenced by the stale reaper.
	PodGone Reason = "PodGone"
	// BackendSetupFailed: the backend a task runs on could not be set up
	// for it (on a lambda Runtime, its function was refused or Lambda was
	// unreachable), so the task never ran.
	BackendSetupFailed Reason = "BackendSetupFailed"
)

// Reasons retried only when spec.retryPolicy.retryableReasons lists them.
const (
	// Unschedulable: no pod could take the Run, e.g. its Runtime does not
	// exist.
	Unschedulable Reason = "Unschedulable"
	// NonZeroExit: a task ran and exited non-zero.
	NonZeroExit Reason = "NonZeroExit"
	// Timeout: a task exceeded spec.timeout, or a function's reservation
	// lifetime ended. Terminal phase Timeout.
	Timeout Reason = "Timeout"
	// SourceFetchFailed: git could not fetch spec.source.git (no such
	// repository, commit or ref, refused credentials, the network).
	SourceFetchFailed Reason = "SourceFetchFailed"
)

// Reasons never retried, whatever the policy lists.
const (
	// Cancelled: spec.cancelRequested was honoured. Terminal phase
	// Cancelled.
	Cancelled Reason = "Cancelled"
	// IncompatibleRuntime: the Run's mode is not served by its Runtime's
	// server (function mode on a server without FunctionRuntime). Permanent.
	IncompatibleRuntime Reason = "IncompatibleRuntime"
	// InvalidSpec: the spec was refused by a Runtime Server (a handler that
	// does not fit the server's syntax, an unusable source). Permanent.
	InvalidSpec Reason = "InvalidSpec"
	// IdleTimeout: a function served no invocation for
	// spec.mode.function.idleTimeoutSeconds. Terminal phase Timeout.
	IdleTimeout Reason = "IdleTimeout"
	// Unknown is recorded when a caller gives no reason.
	Unknown Reason = "Unknown"
)

// Restarted is the reason of a Run made Pending again by [Requeue] because
// Stoke itself restarted: not a failure, no attempt spent.
const Restarted Reason = "Restarted"

var (
	defaultRetryable = []Reason{RuntimeExecute, RegistrationFailed, ExecutionLost, PodGone, BackendSetupFailed}
	neverRetried     = []Reason{Cancelled, IncompatibleRuntime, InvalidSpec, IdleTimeout, Unknown}
)

// DefaultRetryableReasons returns the reasons retried when
// spec.retryPolicy.retryableReasons is empty: RuntimeExecute,
// RegistrationFailed, ExecutionLost, PodGone and BackendSetupFailed.
func DefaultRetryableReasons() []Reason { return slices.Clone(defaultRetryable) }

// Backoff defaults and cap (docs/runs.md: doubling, capped at 60 s).
const (
	// DefaultBackoff is the first delay when spec.retryPolicy.backoff is
	// unset.
	DefaultBackoff = time.Second
	// MaxBackoff caps every delay.
	MaxBackoff = bounds.MaxBackoff
)

// ConditionRetrying is the status condition Apply sets while a Run waits
// for its next attempt: status True, reason the failure reason, and
// lastTransitionTime the (whole-second) time of the failure; [NotBefore]
// reads the earliest start of the next attempt from it. Apply sets it False
// when the Run ends; the scheduler sets it False when it assigns the Run.
const ConditionRetrying = "Retrying"

// Decision is the engine's answer to one failure.
type Decision struct {
	// Retry is true when the Run gets another attempt.
	Retry bool
	// NextAttempt is the status.attempt of that attempt (Retry only).
	NextAttempt int32
	// NotBefore is the earliest time the scheduler may assign the next
	// attempt (Retry only). It is measured from the failure time rounded up
	// to a whole second, because status timestamps are stored with second
	// precision: a retry never starts early after a store round trip.
	NotBefore time.Time
	// Phase is the terminal phase (when not Retry).
	Phase v1alpha1.Phase
	// Reason and Message go to status.reason and status.message in both
	// cases; Message is bounded by bounds.Message.
	Reason  Reason
	Message string
	// At is the clock reading the decision was made with.
	At time.Time
}

// Decide returns what happens to run after a failure with reason and
// message, at now. In order:
//
//   - a Run already in a terminal phase stays as it is;
//   - a Run with spec.cancelRequested, or a failure with reason Cancelled,
//     ends Cancelled (reason Cancelled; the failure is kept in the message);
//   - a reason that is never retried, or not retryable under the policy
//     (spec.retryPolicy.retryableReasons, or DefaultRetryableReasons when
//     that is empty), ends the Run;
//   - a Run whose status.attempt has reached spec.retryPolicy.maxAttempts
//     (0 or no policy: 1, i.e. no retry) ends;
//   - otherwise the Run is retried as attempt status.attempt+1, not before
//     Backoff(policy, status.attempt) from now.
//
// An ending Run's phase is Timeout for Timeout and IdleTimeout, Cancelled
// for Cancelled, and Failed otherwise. A status.attempt below 1 counts as 1.
func Decide(run *v1alpha1.Run, reason Reason, message string, now time.Time) Decision {
	if run.Status.Phase.Terminal() {
		return Decision{
			Phase: run.Status.Phase, Reason: Reason(run.Status.Reason),
			Message: run.Status.Message, At: now,
		}
	}
	if reason == "" {
		reason = Unknown
	}
	attempt := max(run.Status.Attempt, 1)
	policy := run.Spec.RetryPolicy
	maxAttempts := int32(1)
	if policy != nil && policy.MaxAttempts > 1 {
		maxAttempts = policy.MaxAttempts
	}
	end := func(phase v1alpha1.Phase, reason Reason, msg string) Decision {
		return Decision{Phase: phase, Reason: reason, Message: bounds.Truncate(msg, bounds.Message), At: now}
	}

	switch {
	case run.Spec.CancelRequested && reason != Cancelled:
		return end(v1alpha1.PhaseCancelled, Cancelled, fmt.Sprintf("cancelled; attempt %d failed (%s): %s", attempt, reason, message))
	case reason == Cancelled:
		return end(v1alpha1.PhaseCancelled, Cancelled, message)
	case !Retryable(policy, reason):
		return end(terminalPhase(reason), reason, message)
	case attempt >= maxAttempts:
		if maxAttempts > 1 {
			message = fmt.Sprintf("attempt %d of %d failed, no attempts left: %s", attempt, maxAttempts, message)
		}
		return end(terminalPhase(reason), reason, message)
	}

	notBefore := ceilSecond(now).Add(Backoff(policy, attempt))
	return Decision{
		Retry:       true,
		NextAttempt: attempt + 1,
		NotBefore:   notBefore,
		Reason:      reason,
		Message: bounds.Truncate(fmt.Sprintf("attempt %d of %d failed, attempt %d not before %s: %s",
			attempt, maxAttempts, attempt+1, notBefore.UTC().Format(time.RFC3339Nano), message), bounds.Message),
		At: now,
	}
}

// Retryable reports whether reason may be retried under policy: never for
// Cancelled, IncompatibleRuntime, InvalidSpec, IdleTimeout and Unknown;
// otherwise when policy lists it, or, when policy lists none, when it is one
// of DefaultRetryableReasons.
func Retryable(policy *v1alpha1.RetryPolicy, reason Reason) bool {
	if slices.Contains(neverRetried, reason) {
		return false
	}
	if policy == nil || len(policy.RetryableReasons) == 0 {
		return slices.Contains(defaultRetryable, reason)
	}
	return slices.Contains(policy.RetryableReasons, string(reason))
}

// Backoff is the delay before the attempt after failedAttempt (1-based):
// spec.retryPolicy.backoff (DefaultBackoff when unset) doubled for each
// earlier failure, capped at MaxBackoff. An explicit zero backoff retries
// at once. It never overflows.
func Backoff(policy *v1alpha1.RetryPolicy, failedAttempt int32) time.Duration {
	base := DefaultBackoff
	if policy != nil && policy.Backoff != nil {
		base = policy.Backoff.Duration
	}
	if base <= 0 {
		return 0
	}
	if base >= MaxBackoff {
		return MaxBackoff
	}
	doublings := max(failedAttempt-1, 0)
	// base << doublings > MaxBackoff  ⇔  base > MaxBackoff >> doublings,
	// and the right side cannot overflow (it is 0 for doublings ≥ 63).
	if doublings >= 63 || base > MaxBackoff>>doublings {
		return MaxBackoff
	}
	return base << doublings
}

func terminalPhase(reason Reason) v1alpha1.Phase {
	switch reason {
	case Timeout, IdleTimeout:
		return v1alpha1.PhaseTimeout
	case Cancelled:
		return v1alpha1.PhaseCancelled
	}
	return v1alpha1.PhaseFailed
}

func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}
