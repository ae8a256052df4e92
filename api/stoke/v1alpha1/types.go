package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kinds.
const (
	KindRun     = "Run"
	KindRuntime = "Runtime"
)

// FinalizerRuntimed is the finalizer runtimed sets on a function Run while
// it holds a registration for it, so that a delete first drains and
// unregisters; the reaper removes it when the Run's pod is gone.
const FinalizerRuntimed = "stoke.dev/runtimed"

// Phase is where a Run is in its life.
type Phase string

// Run phases. Ready is function-only: active, not terminal.
const (
	PhasePending   Phase = "Pending"
	PhaseScheduled Phase = "Scheduled"
	PhaseRunning   Phase = "Running"
	PhaseReady     Phase = "Ready"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
	PhaseTimeout   Phase = "Timeout"
	PhaseCancelled Phase = "Cancelled"
)

// Terminal reports whether no further transition can happen.
func (p Phase) Terminal() bool {
	switch p {
	case PhaseSucceeded, PhaseFailed, PhaseTimeout, PhaseCancelled:
		return true
	}
	return false
}

// HoldsSlot reports whether a Run in this phase occupies a pod slot.
func (p Phase) HoldsSlot() bool {
	switch p {
	case PhaseScheduled, PhaseRunning, PhaseReady:
		return true
	}
	return false
}

// Run is one execution request: a one-shot task or a function.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Runtime",type=string,JSONPath=`.spec.runtime`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Attempt",type=integer,JSONPath=`.status.attempt`
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.assignedPod`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Run struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RunSpec   `json:"spec"`
	Status RunStatus `json:"status,omitempty"`
}

// RunSpec is what to run. It is immutable after creation except
// cancelRequested (false → true) and ttlSecondsAfterFinished.
type RunSpec struct {
	// Runtime names the Runtime pool.
	Runtime string `json:"runtime"`
	// Mode is exactly one of task or function.
	Mode RunMode `json:"mode"`
	// Source is where the program comes from.
	// +optional
	Source *Source `json:"source,omitempty"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// Timeout is, for a task, its execution limit; for a function, the
	// reservation lifetime from startTime. Zero means the Runtime default.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// +optional
	RetryPolicy *RetryPolicy `json:"retryPolicy,omitempty"`
	// +optional
	CancelRequested bool `json:"cancelRequested,omitempty"`
	// TTLSecondsAfterFinished deletes the Run this long after it finished.
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// RunMode holds exactly one of Task or Function.
type RunMode struct {
	// +optional
	Task *TaskMode `json:"task,omitempty"`
	// +optional
	Function *FunctionMode `json:"function,omitempty"`
}

// TaskMode runs a program once.
type TaskMode struct {
	// Entrypoint is a path relative to the working directory; empty means
	// args is the argv.
	// +optional
	Entrypoint string `json:"entrypoint,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
}

// FunctionMode loads a handler once and serves invocations.
type FunctionMode struct {
	// Handler is file.function (Bash) or module.function (Python).
	Handler string `json:"handler"`
	// IdleTimeoutSeconds ends the Run as Timeout (reason IdleTimeout) after
	// this long without invocations; zero means no idle timeout.
	// +optional
	IdleTimeoutSeconds int64 `json:"idleTimeoutSeconds,omitempty"`
}

// Source is where a Run's program comes from: exactly one of Inline or
// Archive.
type Source struct {
	// +optional
	Inline *InlineSource `json:"inline,omitempty"`
	// +optional
	Archive *ArchiveSource `json:"archive,omitempty"`
}

// InlineSource is program text written to one file.
type InlineSource struct {
	// Path is the file's path relative to the working directory.
	Path string `json:"path"`
	Text string `json:"text"`
}

// ArchiveSource is a small gzipped tar of a directory.
type ArchiveSource struct {
	// TarGz is the archive (base64 in JSON and YAML).
	TarGz []byte `json:"tarGz"`
}

// EnvVar is one environment variable.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// RetryPolicy is the shared retry engine's policy for one Run.
type RetryPolicy struct {
	// MaxAttempts counts attempts including the first: 1–100, default 1.
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// Backoff is the first delay; it doubles per attempt, capped at 60 s.
	// +optional
	Backoff *metav1.Duration `json:"backoff,omitempty"`
	// RetryableReasons lists the failure reasons that may be retried; empty
	// means the engine's default set.
	// +optional
	RetryableReasons []string `json:"retryableReasons,omitempty"`
}

// RunStatus is what happened.
type RunStatus struct {
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is bounded (4 KiB).
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	AssignedPod string `json:"assignedPod,omitempty"`
	// +optional
	AssignedPodUID string `json:"assignedPodUID,omitempty"`
	// Attempt is 1-based; for a function it counts registration attempts.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ExitCode is a task's exit status.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// Outputs are bounded KEY=VALUE results of a task.
	// +optional
	Outputs map[string]string `json:"outputs,omitempty"`
	// Endpoint is a Ready function's invoke URL.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RunList is a list of Runs.
//
// +kubebuilder:object:root=true
type RunList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Run `json:"items"`
}

// Runtime is a pool definition: which Runtime Server, how many pods, how
// many Run slots per pod.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.spec.server`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Runs",type=integer,JSONPath=`.spec.runs`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyPods`
type Runtime struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RuntimeSpec   `json:"spec"`
	Status RuntimeStatus `json:"status,omitempty"`
}

// RuntimeSpec defines a pool.
type RuntimeSpec struct {
	// Server is the built-in Runtime Server: bash, python, or lambda
	// (Runs on AWS Lambda; spec.lambda configures it).
	Server string `json:"server"`
	// Replicas is the number of runtime pods.
	Replicas int32 `json:"replicas"`
	// Runs is the number of Run slots per pod.
	Runs int32 `json:"runs"`
	// DefaultTaskTimeout applies to task Runs without a timeout.
	// +optional
	DefaultTaskTimeout *metav1.Duration `json:"defaultTaskTimeout,omitempty"`
	// DefaultFunctionTimeout applies to function Runs without a timeout.
	// +optional
	DefaultFunctionTimeout *metav1.Duration `json:"defaultFunctionTimeout,omitempty"`
	// DefaultInvokeTimeout applies to invocations without a timeout.
	// +optional
	DefaultInvokeTimeout *metav1.Duration `json:"defaultInvokeTimeout,omitempty"`
	// Lambda configures a Runtime whose server is lambda; required then,
	// forbidden otherwise. AWS credentials, region and endpoint are not
	// here: the pods take them from the environment, as AWS tools do.
	// +optional
	Lambda *LambdaSpec `json:"lambda,omitempty"`
}

// LambdaSpec configures the functions of a lambda Runtime.
type LambdaSpec struct {
	// Runtime is the runtime inside the function: bash or python.
	Runtime string `json:"runtime"`
	// Role is the ARN of the functions' execution role.
	Role string `json:"role"`
	// Architecture is x86_64 or arm64 (default: stoke's own).
	// +optional
	Architecture string `json:"architecture,omitempty"`
	// MemoryMB is the functions' memory (default 512).
	// +optional
	MemoryMB int32 `json:"memoryMB,omitempty"`
	// NamePrefix starts every function name (default "stoke-").
	// +optional
	NamePrefix string `json:"namePrefix,omitempty"`
	// Bootstrap is the absolute path, on the machine that runs the pods,
	// of the stoke binary to package as the functions' bootstrap: one built
	// for Architecture when that is not the pods' own (default: the pods'
	// stoke).
	// +optional
	Bootstrap string `json:"bootstrap,omitempty"`
}

// RuntimeStatus reports the pool's pods.
type RuntimeStatus struct {
	// +optional
	ReadyPods int32 `json:"readyPods,omitempty"`
	// +optional
	Pods []PodStatus `json:"pods,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodStatus is one runtime pod as its supervisor sees it.
type PodStatus struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
	// +optional
	Ready bool `json:"ready,omitempty"`
	// +optional
	LastHeartbeat *metav1.Time `json:"lastHeartbeat,omitempty"`
	// Address is the gRPC target of the pod's Runtime Server (standalone:
	// "unix://…/rs.sock").
	// +optional
	Address string `json:"address,omitempty"`
}

// RuntimeList is a list of Runtimes.
//
// +kubebuilder:object:root=true
type RuntimeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Runtime `json:"items"`
}
