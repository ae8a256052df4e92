package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KindFunction is a function by name: a stable address and as many
// replicas, each an ordinary function Run, as the load needs.
const KindFunction = "Function"

// LabelTemplateHash is on every replica Run beside LabelFunction: the
// hash of the Function spec's template fields (runtime, handler, source,
// env, timeout) the Run was made from. A Run whose hash is not the
// Function's current one is old and is rolled away.
const LabelTemplateHash = "stoke.dev/template-hash"

// AnnotationDrainingSince is set beside AnnotationDraining: when the
// Function controller marked the replica (RFC 3339), from which it counts
// the Function's drainSeconds before it deletes the Run.
const AnnotationDrainingSince = "stoke.dev/draining-since"

// Function is a function by name: the template of its replicas (each an
// ordinary function Run with the one-registration contract unchanged), how
// many there may be, and the queue its invocations wait in when no replica
// is idle. Its invoke URL, /v1/namespaces/{ns}/functions/{name}/invoke,
// lasts across spec changes and replica replacement.
//
// spec.replicas is the desired count that `kubectl scale`, HPA-style tools
// and Stoke's autoscaler set (the scale subresource); the controller keeps
// that many replicas, clamped to spec.scale's [min, max].
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,shortName=fn
// +kubebuilder:printcolumn:name="Runtime",type=string,JSONPath=`.spec.runtime`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="In-Flight",type=integer,JSONPath=`.status.inFlight`
// +kubebuilder:printcolumn:name="Queued",type=integer,JSONPath=`.status.queued`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`,priority=1
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.spec.scale.min`,priority=1
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.scale.max`,priority=1
// +kubebuilder:printcolumn:name="Handler",type=string,JSONPath=`.spec.handler`,priority=1
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
type Function struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FunctionSpec   `json:"spec"`
	Status FunctionStatus `json:"status,omitempty"`
}

// FunctionSpec is a Function's replica template, its scale and its queue.
// Every field may change: a change of the template fields (runtime,
// handler, source, env, timeout) rolls the replicas; scale, queue,
// replicas and drainSeconds apply in place.
//
// +kubebuilder:validation:XValidation:rule="self.scale.min <= self.scale.max",message="scale.min must not exceed scale.max",fieldPath=".scale"
type FunctionSpec struct {
	// Runtime names the Runtime pool the replicas run in.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Runtime string `json:"runtime"`
	// Handler is file.function (Bash) or module.function (Python), as a
	// function Run's spec.mode.function.handler.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 512",message="is over 512 bytes"
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^\\x00]*[^/\\x00][.][A-Za-z_][A-Za-z0-9_]*$')",message="must be file.function or module.function: a file or module, a '.', and a function name matching [A-Za-z_][A-Za-z0-9_]*"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="must not contain '..'"
	Handler string `json:"handler"`
	// Source is where the program comes from, as a Run's.
	// +optional
	Source *Source `json:"source,omitempty"`
	// Env is the program's environment; names are unique.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
	// Timeout is each replica's reservation lifetime from its start, as a
	// function Run's spec.timeout; zero means the Runtime's default. A
	// replica that reaches it is replaced.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// Replicas is the desired number of replicas (the scale subresource's
	// spec): what `kubectl scale` and the autoscaler set. Unset means
	// scale.min. The controller clamps it to [scale.min, scale.max].
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	Replicas *int32 `json:"replicas,omitempty"`
	// Scale bounds the replicas and steers the autoscaler.
	// +optional
	// +kubebuilder:default={}
	Scale FunctionScale `json:"scale"`
	// Queue bounds the invocations that wait for an idle replica.
	// +optional
	// +kubebuilder:default={}
	Queue FunctionQueue `json:"queue"`
	// DrainSeconds bounds how long a replica being taken away is marked
	// draining (AnnotationDraining) before it is deleted, when the
	// dispatchers do not report it idle sooner (1–300; unset or 0 means
	// 2). Its in-flight invocation is not cut then: the Run's delete
	// drains it.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	DrainSeconds int32 `json:"drainSeconds,omitempty"`
}

// FunctionScale bounds a Function's replicas and steers its autoscaler.
// Its numbers, and FunctionQueue's and drainSeconds, are omitted from JSON
// when 0, so that a Go client's zero leaves the CRD's default in place.
type FunctionScale struct {
	// Min is the fewest replicas, kept even when idle (default 0: an idle
	// Function has none, and its first invocation waits in the queue
	// while one registers on a warm pod). At most 1024.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	Min int32 `json:"min,omitempty"`
	// Max is the most replicas (1–1024; unset or 0 means 8).
	// +optional
	// +kubebuilder:default=8
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Max int32 `json:"max,omitempty"`
	// TargetInFlight is the in-flight plus queued invocations per replica
	// the autoscaler aims at (default 1, the contract's one invocation in
	// flight per registration; 1–1024, 0 means 1).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	TargetInFlight int32 `json:"targetInFlight,omitempty"`
	// IdleSeconds is how long the load must stay below the replicas
	// before the autoscaler scales down (1–86400; unset or 0 means 60).
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	IdleSeconds int32 `json:"idleSeconds,omitempty"`
}

// FunctionQueue bounds the per-Function FIFO queue of invocations waiting
// for an idle replica. An invocation that finds it full, or waits longer
// than MaxWait (or its own timeout, whichever ends first), is answered 429
// with Retry-After.
type FunctionQueue struct {
	// Length is the most invocations waiting at once (1–10000; unset or 0
	// means 256).
	// +optional
	// +kubebuilder:default=256
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Length int32 `json:"length,omitempty"`
	// MaxWait is the longest an invocation waits in the queue (default
	// 10s; more than 0 and at most 15m, the longest invocation timeout).
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('15m')",message="must be more than 0s and at most 15m"
	MaxWait *metav1.Duration `json:"maxWait,omitempty"`
}

// FunctionStatus is what the controller, the dispatcher and the autoscaler
// report of a Function.
type FunctionStatus struct {
	// ObservedGeneration is the generation the controller last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas counts the replica Runs that are not terminal, draining
	// ones included (the scale subresource's status).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas counts the Ready replicas that are not draining.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// UpdatedReplicas counts the replicas of the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// InFlight and Queued are the invocations running on a replica and
	// waiting for one, as the dispatcher last reported them.
	// +optional
	InFlight int32 `json:"inFlight,omitempty"`
	// +optional
	Queued int32 `json:"queued,omitempty"`
	// Selector is the label selector of the replica Runs
	// (stoke.dev/function=NAME), for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// TemplateHash is the current template's hash (LabelTemplateHash).
	// +optional
	TemplateHash string `json:"templateHash,omitempty"`
	// LastScale is the autoscaler's last change of the desired count.
	// +optional
	LastScale *ScaleDecision `json:"lastScale,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ScaleDecision is one change of a Function's desired replicas.
type ScaleDecision struct {
	Time metav1.Time `json:"time"`
	From int32       `json:"from"`
	To   int32       `json:"to"`
	// Reason says why, in words (e.g. "4 in flight + 3 queued over
	// 10s, target 1 per replica").
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
}

// FunctionList is a list of Functions.
//
// +kubebuilder:object:root=true
type FunctionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Function `json:"items"`
}
