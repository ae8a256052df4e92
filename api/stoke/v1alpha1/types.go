package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
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

// AnnotationClaimFirst, "true" on a task Run, has runtimed write it
// Running before it starts, as stoke up does every task, rather than
// once it has run 100 ms (Kubernetes mode's deferred claim,
// docs/runtimed.md): for a task that a client reaches through exec as
// soon as it runs, such as a workflow's artifact step.
const AnnotationClaimFirst = "stoke.dev/claim-first"

// AnnotationPlaced, "true" on a Run created with spec.placement.podUID,
// says that its creator had the scheduler place it on that pod before the
// create (a Function's replica): the pod's runtimed may then take it as
// created, writing its assignment with its claim, with no Scheduled write
// before (docs/runtimed.md, "Placed at create"). The scheduler writes
// the assignment itself if runtimed has not taken it soon after.
const AnnotationPlaced = "stoke.dev/placed"

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
// The markers below generate deploy/crds/stoke.dev_runs.yaml: the columns of
// `stoke get runs` (MODE has none: a column is one JSONPath value, and the
// mode is which key is set), the fields a runtimed or the scheduler selects
// on, and as much of internal/validation as CEL and OpenAPI can say.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:selectablefield:JSONPath=`.status.phase`
// +kubebuilder:selectablefield:JSONPath=`.status.assignedPodUID`
// +kubebuilder:selectablefield:JSONPath=`.spec.placement.podUID`
// +kubebuilder:printcolumn:name="Runtime",type=string,JSONPath=`.spec.runtime`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Attempt",type=integer,JSONPath=`.status.attempt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Exit",type=integer,JSONPath=`.status.exitCode`,priority=1
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.assignedPod`,priority=1
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
type Run struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RunSpec   `json:"spec"`
	Status RunStatus `json:"status,omitempty"`
}

// RunSpec is what to run. It is immutable after creation except
// cancelRequested (false → true), held (true → false) and
// ttlSecondsAfterFinished.
//
// +kubebuilder:validation:XValidation:rule="self.runtime == oldSelf.runtime",message="is immutable",fieldPath=".runtime"
// +kubebuilder:validation:XValidation:rule="self.mode == oldSelf.mode",message="is immutable",fieldPath=".mode"
// +kubebuilder:validation:XValidation:rule="has(self.source) == has(oldSelf.source) && (!has(self.source) || self.source == oldSelf.source)",message="is immutable",fieldPath=".source"
// +kubebuilder:validation:XValidation:rule="has(self.env) == has(oldSelf.env) && (!has(self.env) || self.env == oldSelf.env)",message="is immutable",fieldPath=".env"
// +kubebuilder:validation:XValidation:rule="has(self.timeout) == has(oldSelf.timeout) && (!has(self.timeout) || self.timeout == oldSelf.timeout)",message="is immutable",fieldPath=".timeout"
// +kubebuilder:validation:XValidation:rule="has(self.retryPolicy) == has(oldSelf.retryPolicy) && (!has(self.retryPolicy) || self.retryPolicy == oldSelf.retryPolicy)",message="is immutable",fieldPath=".retryPolicy"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.cancelRequested) || !oldSelf.cancelRequested || (has(self.cancelRequested) && self.cancelRequested)",message="cannot be unset once true",fieldPath=".cancelRequested"
// +kubebuilder:validation:XValidation:rule="has(self.placement) == has(oldSelf.placement) && (!has(self.placement) || self.placement == oldSelf.placement)",message="is immutable",fieldPath=".placement"
// +kubebuilder:validation:XValidation:rule="!has(self.held) || !self.held || (has(oldSelf.held) && oldSelf.held)",message="cannot be set once cleared: a Run is held only from its creation",fieldPath=".held"
type RunSpec struct {
	// Runtime names the Runtime pool: a DNS-1123 label, like the Runtime's
	// name.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Runtime string `json:"runtime"`
	// Mode is exactly one of task or function.
	Mode RunMode `json:"mode"`
	// Source is where the program comes from.
	// +optional
	Source *Source `json:"source,omitempty"`
	// Env is the program's environment; names are unique.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
	// Timeout is, for a task, its execution limit; for a function, the
	// reservation lifetime from startTime. Zero means the Runtime default.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// +optional
	RetryPolicy *RetryPolicy `json:"retryPolicy,omitempty"`
	// +optional
	CancelRequested bool `json:"cancelRequested,omitempty"`
	// Held keeps the Run from being scheduled until it is cleared (true →
	// false, once), as a Kubernetes Job's suspend does before it starts:
	// a Docker container created and not started is a held task Run
	// (`docker start` clears it). A held Run waits in phase Pending with
	// reason Held; cancelRequested ends it Cancelled.
	// +optional
	Held bool `json:"held,omitempty"`
	// TTLSecondsAfterFinished deletes the Run this long after it finished.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// Placement pins the Run to one runtime pod and a workspace on it
	// (a workflow job's steps: docs/runs.md, Placement).
	// +optional
	Placement *Placement `json:"placement,omitempty"`
}

// Placement says where on the pool a Run runs, beyond a free slot.
//
// +kubebuilder:validation:XValidation:rule="!has(self.releaseWorkspace) || !self.releaseWorkspace || has(self.workspace)",message="needs a workspace",fieldPath=".releaseWorkspace"
type Placement struct {
	// PodUID runs the Run only on the runtime pod with this UID: the
	// scheduler waits for a free slot there, and ends the Run Failed
	// (reason Unschedulable) when that pod is gone or never was.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.]*$`
	PodUID string `json:"podUID,omitempty"`
	// Workspace names a directory on the pod that the Runs naming it
	// share, and that is their working directory instead of a directory
	// of their own: files one Run writes there are there for the next.
	// It is made by the first Run that names it and removed when a Run
	// with releaseWorkspace ends (or when its pod goes).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.]*$`
	Workspace string `json:"workspace,omitempty"`
	// ReleaseWorkspace removes the workspace when this Run ends, whatever
	// its phase: the owner's signal that no later Run names it (a
	// workflow job's last Run, or a Run of its own made to clean up).
	// +optional
	ReleaseWorkspace bool `json:"releaseWorkspace,omitempty"`
}

// RunMode holds exactly one of Task or Function.
//
// +kubebuilder:validation:XValidation:rule="has(self.task) != has(self.function)",message="exactly one of task or function must be set"
type RunMode struct {
	// +optional
	Task *TaskMode `json:"task,omitempty"`
	// +optional
	Function *FunctionMode `json:"function,omitempty"`
}

// TaskMode runs a program once.
//
// +kubebuilder:validation:XValidation:rule="(has(self.entrypoint) && size(self.entrypoint) > 0) || (has(self.args) && size(self.args) > 0)",message="entrypoint or args must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.ttySize) || (has(self.tty) && self.tty)",message="needs tty",fieldPath=".ttySize"
type TaskMode struct {
	// Entrypoint is a path relative to the working directory; empty means
	// args is the argv.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\x00')",message="contains a NUL byte"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith('/') && !self.matches('(^|/)[.]$')",message="names a directory, not a file in the working directory"
	Entrypoint string `json:"entrypoint,omitempty"`
	// Args are the arguments (the argv when entrypoint is empty); each at
	// most 8 KiB, counted in bytes.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=8192
	// +kubebuilder:validation:items:Pattern=`^[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self.all(a, size(bytes(a)) <= 8192)",message="an argument is over 8192 bytes"
	Args []string `json:"args,omitempty"`
	// Stdin keeps the program's stdin open for attach sessions (`docker
	// attach`, `docker run -i`) instead of reading /dev/null; the
	// program blocks reading it until one writes.
	// +optional
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the program on a pseudo-terminal (its stdin, stdout and
	// stderr; its output is one stream, stdout), reached through attach
	// sessions (`docker run -t`, resize).
	// +optional
	TTY bool `json:"tty,omitempty"`
	// TTYSize is the terminal's size at the start (with tty: `docker
	// create`'s ConsoleSize); unset, 80×24. Attach sessions resize it.
	// +optional
	TTYSize *TerminalSize `json:"ttySize,omitempty"`
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Width int32 `json:"width"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Height int32 `json:"height"`
}

// FunctionMode loads a handler once and serves invocations.
type FunctionMode struct {
	// Handler is file.function (Bash) or module.function (Python).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 512",message="is over 512 bytes"
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^\\x00]*[^/\\x00][.][A-Za-z_][A-Za-z0-9_]*$')",message="must be file.function or module.function: a file or module, a '.', and a function name matching [A-Za-z_][A-Za-z0-9_]*"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="must not contain '..'"
	Handler string `json:"handler"`
	// IdleTimeoutSeconds ends the Run as Timeout (reason IdleTimeout) after
	// this long without invocations; zero means no idle timeout.
	// +optional
	// +kubebuilder:validation:Minimum=0
	IdleTimeoutSeconds int64 `json:"idleTimeoutSeconds,omitempty"`
}

// Source is where a Run's program comes from: at most one of Inline or
// Archive, and optionally Git, which is checked out first (an inline
// file or the archive's files are then written over it).
//
// +kubebuilder:validation:XValidation:rule="!(has(self.inline) && has(self.archive))",message="at most one of inline or archive may be set"
type Source struct {
	// +optional
	Inline *InlineSource `json:"inline,omitempty"`
	// +optional
	Archive *ArchiveSource `json:"archive,omitempty"`
	// Git checks out a commit of a repository into the working directory
	// (or Path inside it).
	// +optional
	Git *GitSource `json:"git,omitempty"`
}

// InlineSource is program text written to one file.
type InlineSource struct {
	// Path is the file's path relative to the working directory.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\x00')",message="contains a NUL byte"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith('/') && !self.matches('(^|/)[.]$')",message="names a directory, not a file in the working directory"
	Path string `json:"path"`
	// Text is the file's content, at most 1 MiB counted in bytes.
	// +kubebuilder:validation:MaxLength=1048576
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 1048576",message="is over 1048576 bytes"
	Text string `json:"text"`
}

// ArchiveSource is a small gzipped tar of a directory.
type ArchiveSource struct {
	// The CRD's schema for tarGz is a plain string, not format byte: the
	// API server's CEL decodes format byte as URL-safe base64, so any rule
	// that reads the field (the spec's immutability) fails on the '+' and
	// '/' of standard base64. The pattern keeps it standard base64 of gzip
	// data (1f 8b encodes as "H4s"…"H4v"); the rules bound its decoded size.

	// TarGz is the archive, a gzipped tar (standard base64 in JSON and
	// YAML), at most 1 MiB before base64.
	// +kubebuilder:validation:Format=""
	// +kubebuilder:validation:MinLength=4
	// +kubebuilder:validation:MaxLength=1398104
	// +kubebuilder:validation:Pattern=`^H4[s-v][A-Za-z0-9+/]*={0,2}$`
	// +kubebuilder:validation:XValidation:rule="size(self) % 4 == 0",message="is not base64: its length is not a multiple of 4"
	// +kubebuilder:validation:XValidation:rule="size(self) / 4 * 3 - (self.endsWith('==') ? 2 : self.endsWith('=') ? 1 : 0) <= 1048576",message="is over 1048576 bytes"
	TarGz []byte `json:"tarGz"`
}

// EnvVar is one environment variable.
type EnvVar struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	Name string `json:"name"`
	// +kubebuilder:validation:Pattern=`^[^\x00]*$`
	Value string `json:"value"`
}

// RetryPolicy is the shared retry engine's policy for one Run.
type RetryPolicy struct {
	// MaxAttempts counts attempts including the first: 1–100, default 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// Backoff is the first delay; it doubles per attempt, capped at 60 s.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	Backoff *metav1.Duration `json:"backoff,omitempty"`
	// RetryableReasons lists the failure reasons that may be retried; empty
	// means the engine's default set. Each is a condition reason.
	// +optional
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`
	RetryableReasons []string `json:"retryableReasons,omitempty"`
}

// RunStatus is what happened.
type RunStatus struct {
	// +optional
	// +kubebuilder:validation:Enum=Pending;Scheduled;Running;Ready;Succeeded;Failed;Timeout;Cancelled
	Phase Phase `json:"phase,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is bounded (4 KiB).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
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
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 128 && size(self[k]) <= 8192)",message="an output key is over 128 characters or a value over 8192"
	Outputs map[string]string `json:"outputs,omitempty"`
	// Env is what a task wrote to $GITHUB_ENV, in order, bounded as
	// outputs are; a workflow passes it on to the job's later steps.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Env []EnvVar `json:"env,omitempty"`
	// Summary is what a task wrote to $GITHUB_STEP_SUMMARY (Markdown, as
	// GitHub's step summary), cut to 8 KiB (bounds.StepSummary) with a
	// note (bounds.StepSummaryStored in all); `stoke describe workflowrun`
	// shows a step's.
	// +optional
	// +kubebuilder:validation:MaxLength=8448
	Summary string `json:"summary,omitempty"`
	// SourceCommit is the commit spec.source.git checked out (its ref
	// resolved once, so that every attempt checks out the same tree).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SourceCommit string `json:"sourceCommit,omitempty"`
	// Endpoint is a Ready function's invoke URL.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
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
// many Run slots per pod. Its name is what spec.runtime of a Run names, so
// it is a DNS-1123 label.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.spec.server`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Runs",type=integer,JSONPath=`.spec.runs`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyPods`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.freeSlots`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Invoke-Timeout",type=string,JSONPath=`.spec.defaultInvokeTimeout`,priority=1
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
type Runtime struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RuntimeSpec   `json:"spec"`
	Status RuntimeStatus `json:"status,omitempty"`
}

// RuntimeSpec defines a pool.
//
// +kubebuilder:validation:XValidation:rule="self.server == oldSelf.server",message="is immutable",fieldPath=".server"
// +kubebuilder:validation:XValidation:rule="(self.server == 'lambda') == has(self.lambda)",message="is required for server lambda and only for it",fieldPath=".lambda"
type RuntimeSpec struct {
	// Server is the built-in Runtime Server: bash, python, or lambda
	// (Runs on AWS Lambda; spec.lambda configures it).
	// +kubebuilder:validation:Enum=bash;python;lambda
	Server string `json:"server"`
	// Replicas is the number of runtime pods.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	Replicas int32 `json:"replicas"`
	// Runs is the number of Run slots per pod (default 1).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Runs int32 `json:"runs"`
	// DefaultTaskTimeout applies to task Runs without a timeout.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	DefaultTaskTimeout *metav1.Duration `json:"defaultTaskTimeout,omitempty"`
	// DefaultFunctionTimeout applies to function Runs without a timeout.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	DefaultFunctionTimeout *metav1.Duration `json:"defaultFunctionTimeout,omitempty"`
	// DefaultInvokeTimeout applies to invocations without a timeout.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative"
	DefaultInvokeTimeout *metav1.Duration `json:"defaultInvokeTimeout,omitempty"`
	// Lambda configures a Runtime whose server is lambda; required then,
	// forbidden otherwise. AWS credentials, region and endpoint are not
	// here: the pods take them from the environment, as AWS tools do.
	// +optional
	Lambda *LambdaSpec `json:"lambda,omitempty"`
	// Template is what a platform team sets on the runtime pods: in
	// Kubernetes mode the runtime-server container's image, resources,
	// env and mounts and the Pod's scheduling; in standalone only env
	// applies (stoke up refuses the rest, naming the field).
	// +optional
	Template *RuntimeTemplate `json:"template,omitempty"`
	// Git configures the fetches of its Runs' spec.source.git (Kubernetes
	// mode; stoke up takes its --git-credentials file instead).
	// +optional
	Git *RuntimeGit `json:"git,omitempty"`
}

// RuntimeGit is how a Runtime's pods fetch git sources.
type RuntimeGit struct {
	// CredentialsSecret names a Secret in the Runtime's namespace whose
	// key "git-credentials" is in git's credential-store format (one
	// https://USER:PASSWORD@HOST[/PATH] per line, as stoke up's
	// --git-credentials file). It is mounted into the runtimed container
	// alone, never into the runtime-server container where users' code
	// runs, and sent to git through its environment, never its arguments
	// or logs. Only Runs whose spec.source.git.credentialsSecret names it
	// fetch with it; a Run naming another Secret fails InvalidSpec.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// GitCredentialsKey is the key of a Runtime's spec.git.credentialsSecret
// that holds the credentials.
const GitCredentialsKey = "git-credentials"

// Names and paths of a runtime Pod that are Stoke's own; a template may
// not take them (RuntimeTemplate's rules state them again, as CEL takes
// only literals).
var (
	// ReservedVolumes are the runtime Pod's own volumes.
	ReservedVolumes = []string{"run", "workspace", "tls", "kube-api-access", "stoke-bin", "git-cache", "runtime-server-token", "git-credentials", "runtimed-state"}
	// ReservedMountPaths are where the runtime-server container mounts
	// them; a template mount may be neither one of them nor beneath one.
	// /run/stoke is /var/run/stoke where /var/run links to /run.
	ReservedMountPaths = []string{"/var/run/stoke", "/run/stoke", "/workspace", "/var/run/stoke-bin", "/var/run/stoke-tls", "/var/run/secrets/kubernetes.io/serviceaccount"}
	// ReservedEnv are the variables Stoke sets on the runtime-server
	// container; names starting with ReservedEnvPrefix are Stoke's too
	// (STOKE_OUTPUTS, STOKE_RUN_UID, … are set per Run).
	ReservedEnv       = []string{"POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"}
	ReservedEnvPrefix = "STOKE_"
	// ReservedServiceAccounts are Stoke's own ServiceAccounts (the
	// runtime Pods' and the chart's), which a template may not give to
	// users' code.
	ReservedServiceAccounts = []string{"stoke-runtimed", "stoke-controller", "stoke-gateway"}
)

// RuntimeTemplate is what a platform team sets on a Runtime's pods. The
// runtime-server container, which runs users' code, may run a user's
// image (bash, python3 and the user's packages; no Stoke in it: an init
// container copies Stoke's binary from Stoke's own image into the Pod);
// runtimed always runs Stoke's image with Stoke's settings. Nothing here
// may replace what the Pod needs of Stoke's: its volumes, their paths, or
// the variables Stoke sets.
//
// (That every mount is of a template volume, and that env names match
// [A-Za-z_][A-Za-z0-9_]*, internal/validation checks and CEL cannot: the
// core/v1 strings have no maxLength, so such rules exceed the API
// server's cost budget. The API server refuses a mount of no volume when
// the controller writes the Deployment.)
// +kubebuilder:validation:XValidation:rule="!(has(self.automountServiceAccountToken) && self.automountServiceAccountToken) || (has(self.serviceAccountName) && size(self.serviceAccountName) > 0)",message="needs a serviceAccountName: the runtime-server container gets no token but its template's ServiceAccount's",fieldPath=".automountServiceAccountToken"
type RuntimeTemplate struct {
	// Image is the runtime-server container's image (default: Stoke's
	// own, the controller's --image). It needs bash and python3 on its
	// PATH, not Stoke. With a user's image, handlers start from the
	// container's environment (the image's ENV and env below).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the image (default IfNotPresent).
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Resources of the runtime-server container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// Env of the runtime-server container; every handler and task gets
	// it, beneath its Run's own env. Names are [A-Za-z_][A-Za-z0-9_]*,
	// unique, and not Stoke's (POD_NAME, POD_NAMESPACE, POD_UID, POD_IP,
	// STOKE_*). PYTHONPATH here is the extra Python path of the pool.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['POD_NAME', 'POD_NAMESPACE', 'POD_UID', 'POD_IP']) && !e.name.startsWith('STOKE_'))",message="POD_NAME, POD_NAMESPACE, POD_UID, POD_IP and STOKE_* are Stoke's own variables"
	Env []corev1.EnvVar `json:"env,omitempty"`
	// Volumes added to the Pod, for volumeMounts. Names may not be
	// Stoke's own: run, workspace, tls, kube-api-access, stoke-bin,
	// git-cache, runtime-server-token, git-credentials.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(v, !(v.name in ['run', 'workspace', 'tls', 'kube-api-access', 'stoke-bin', 'git-cache', 'runtime-server-token', 'git-credentials', 'runtimed-state']))",message="run, workspace, tls, kube-api-access, stoke-bin, git-cache, runtime-server-token, git-credentials and runtimed-state are the runtime Pod's own volumes"
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// VolumeMounts of the runtime-server container, each of a volume of
	// Volumes, neither at nor beneath Stoke's own paths (/var/run/stoke,
	// /workspace, /var/run/stoke-bin, /var/run/stoke-tls, the
	// ServiceAccount token's directory).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(m, !['/var/run/stoke', '/run/stoke', '/workspace', '/var/run/stoke-bin', '/var/run/stoke-tls', '/var/run/secrets/kubernetes.io/serviceaccount'].exists(p, m.mountPath == p || m.mountPath.startsWith(p + '/')))",message="a mountPath may not be, or be beneath, the runtime Pod's own /var/run/stoke, /workspace, /var/run/stoke-bin, /var/run/stoke-tls or /var/run/secrets/kubernetes.io/serviceaccount"
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// NodeSelector of the Pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the Pod.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity of the Pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// PriorityClassName of the Pod.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ImagePullSecrets of the Pod, for the image.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// ServiceAccountName is the ServiceAccount (of the Runtime's
	// namespace) whose token the runtime-server container gets, for
	// users' code that calls the API server. The Pod's own ServiceAccount
	// stays stoke-runtimed, whose token only runtimed mounts: the
	// controller mints this one (a TokenRequest bound to a Secret it owns,
	// refreshed at 80 % of its lifetime) and the runtime-server container
	// alone mounts it, at /var/run/secrets/kubernetes.io/serviceaccount
	// (token, ca.crt, namespace). Without it the container has no token at
	// all. Not one of Stoke's own (stoke-runtimed, stoke-controller,
	// stoke-gateway).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="!(self in ['stoke-runtimed', 'stoke-controller', 'stoke-gateway'])",message="stoke-runtimed, stoke-controller and stoke-gateway are Stoke's own ServiceAccounts: users' code may not have their identity"
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// AutomountServiceAccountToken says whether the runtime-server
	// container gets ServiceAccountName's token (default true when
	// ServiceAccountName is set); true without ServiceAccountName is
	// refused.
	// +optional
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
}

// MountsServiceAccountToken says whether the runtime-server container
// gets the template's ServiceAccount's token.
func (t *RuntimeTemplate) MountsServiceAccountToken() bool {
	return t != nil && t.ServiceAccountName != "" && (t.AutomountServiceAccountToken == nil || *t.AutomountServiceAccountToken)
}

// LambdaSpec configures the functions of a lambda Runtime.
// +kubebuilder:validation:XValidation:rule="!(has(self.image) && has(self.bootstrap))",message="image and bootstrap exclude each other: an image function's bootstrap is the image's /opt/stoke/bootstrap"
type LambdaSpec struct {
	// Runtime is the runtime inside the function: bash or python.
	// +kubebuilder:validation:Enum=bash;python
	Runtime string `json:"runtime"`
	// Role is the ARN of the functions' execution role.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:`
	Role string `json:"role"`
	// Architecture is x86_64 or arm64 (default: stoke's own).
	// +optional
	// +kubebuilder:validation:Pattern=`^(x86_64|arm64)?$`
	Architecture string `json:"architecture,omitempty"`
	// MemoryMB is the functions' memory: 128–10240, default (0) 512.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == 0 || (self >= 128 && self <= 10240)",message="must be 128–10240 (0 means 512)"
	MemoryMB int32 `json:"memoryMB,omitempty"`
	// NamePrefix starts every function name (default "stoke-").
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]*$`
	NamePrefix string `json:"namePrefix,omitempty"`
	// Bootstrap is the absolute path, on the machine that runs the pods,
	// of the binary to package as the functions' bootstrap: a
	// stoke-lambda-bootstrap (or a stoke) built for Architecture when that
	// is not the pods' own (default: the stoke-lambda-bootstrap beside the
	// pods' stoke).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^(/.*)?$`
	Bootstrap string `json:"bootstrap,omitempty"`
	// AgentListen is where exec's reverse agents, dialling back from the
	// functions, connect: host:port (default 127.0.0.1:0, which only
	// sandboxes on the pods' machine reach). Anything but a loopback
	// address needs AgentCert and AgentKey.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	AgentListen string `json:"agentListen,omitempty"`
	// AgentURL is the public URL of AgentListen that the functions dial:
	// wss://HOST[:PORT]/v1/agent, or ws:// to a loopback address
	// (default: AgentListen's own address).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(wss?://.*)?$`
	AgentURL string `json:"agentURL,omitempty"`
	// AgentCert and AgentKey are the absolute paths, on the machine that
	// runs the pods, of the agent endpoint's TLS certificate and key (PEM).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^(/.*)?$`
	AgentCert string `json:"agentCert,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^(/.*)?$`
	AgentKey string `json:"agentKey,omitempty"`
	// Image makes the functions container-image functions of this image
	// (PackageType Image; an ECR URI): the image holds the code at its
	// LAMBDA_TASK_ROOT and a stoke binary at /opt/stoke/bootstrap, which
	// Stoke makes the entrypoint (docs/lambda.md gives the Dockerfile
	// lines). Its Runs carry no source. Not with bootstrap.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[^\s]*$`
	Image string `json:"image,omitempty"`
}

// RuntimeStatus reports the pool's pods.
type RuntimeStatus struct {
	// +optional
	ReadyPods int32 `json:"readyPods,omitempty"`
	// FreeSlots is the Run slots of the ready pods that no Run holds.
	// +optional
	FreeSlots int32 `json:"freeSlots,omitempty"`
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
