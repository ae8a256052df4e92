package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Workflow kinds.
const (
	KindWorkflowRun = "WorkflowRun"
	KindWorkflow    = "Workflow"
)

// The step `uses:` a WorkflowRun knows; any other step `uses:` is refused
// at create. A job's `uses:` names a Workflow instead.
const (
	UsesCheckout         = "checkout"
	UsesUploadArtifact   = "upload-artifact"
	UsesDownloadArtifact = "download-artifact"
)

// WorkflowPhase is where a WorkflowRun is in its life.
type WorkflowPhase string

// WorkflowRun phases.
const (
	WorkflowPending   WorkflowPhase = "Pending"
	WorkflowRunning   WorkflowPhase = "Running"
	WorkflowSucceeded WorkflowPhase = "Succeeded"
	WorkflowFailed    WorkflowPhase = "Failed"
	WorkflowCancelled WorkflowPhase = "Cancelled"
)

// Terminal reports whether no further transition can happen.
func (p WorkflowPhase) Terminal() bool {
	return p == WorkflowSucceeded || p == WorkflowFailed || p == WorkflowCancelled
}

// JobPhase is where a job instance, or one of its steps, is.
type JobPhase string

// Job and step phases.
const (
	JobPending   JobPhase = "Pending"
	JobRunning   JobPhase = "Running"
	JobSucceeded JobPhase = "Succeeded"
	JobFailed    JobPhase = "Failed"
	JobSkipped   JobPhase = "Skipped"
	JobCancelled JobPhase = "Cancelled"
)

// Terminal reports whether no further transition can happen (until the
// job is retried whole, which starts a new attempt).
func (p JobPhase) Terminal() bool {
	return p == JobSucceeded || p == JobFailed || p == JobSkipped || p == JobCancelled
}

// WorkflowRun is one execution of a DAG of jobs: its own inline jobs, or a
// Workflow's by name. Its spec is immutable but for cancelRequested.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=wfr
// +kubebuilder:printcolumn:name="Workflow",type=string,JSONPath=`.spec.workflow`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
type WorkflowRun struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkflowRunSpec   `json:"spec"`
	Status WorkflowRunStatus `json:"status,omitempty"`
}

// WorkflowRunSpec is what to run: exactly one of workflow (a Workflow's
// name, with inputs) or jobs. The CRD says what CEL can of
// internal/validation (which also runs when the run starts): cycles,
// expressions and calls are not CEL's to check.
//
// +kubebuilder:validation:XValidation:rule="has(self.workflow) != has(self.jobs)",message="exactly one of workflow or jobs must be set"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.cancelRequested) || !oldSelf.cancelRequested || (has(self.cancelRequested) && self.cancelRequested)",message="cannot be unset once true",fieldPath=".cancelRequested"
type WorkflowRunSpec struct {
	// Workflow names a Workflow in the namespace to run; it excludes jobs
	// and env, which are then the Workflow's.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Workflow string `json:"workflow,omitempty"`
	// Inputs are the Workflow's inputs (values; the Workflow types them).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Inputs []NameValue `json:"inputs,omitempty"`
	// Jobs is the DAG: each job's needs name the jobs it waits for.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=64
	Jobs []Job `json:"jobs,omitempty"`
	// Env is every job's environment (a job's and a step's own win).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
	// Source is the commit `uses: checkout` checks out.
	// +optional
	Source *GitSource `json:"source,omitempty"`
	// CancelRequested asks the controller to cancel: running step Runs
	// are cancelled, jobs not started are Skipped. It cannot be unset.
	// +optional
	CancelRequested bool `json:"cancelRequested,omitempty"`
	// TTLSecondsAfterFinished deletes the WorkflowRun (and its step Runs)
	// this long after it ends; unset keeps it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// Job is one node of the DAG: steps run in order in one workspace on one
// runtime pod of runsOn, or uses: a Workflow called with with:.
//
// +kubebuilder:validation:XValidation:rule="has(self.uses) != has(self.steps)",message="exactly one of steps or uses must be set"
// +kubebuilder:validation:XValidation:rule="has(self.uses) || has(self.runsOn)",message="must name a Runtime",fieldPath=".runsOn"
// +kubebuilder:validation:XValidation:rule="!has(self.uses) || !has(self.runsOn)",message="must be empty with uses (the called Workflow's jobs say where they run)",fieldPath=".runsOn"
type Job struct {
	// ID names the job in needs, in expressions and in status.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_-]*$`
	ID string `json:"id"`
	// Name is a display name.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name,omitempty"`
	// Needs are the job IDs that must end before this job starts.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	Needs []string `json:"needs,omitempty"`
	// If is an expression (with or without ${{ }}); the job runs when it
	// is true. Unset means success().
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	If string `json:"if,omitempty"`
	// RunsOn names the Runtime the job's steps run in (or is an
	// expression, ${{ matrix.runtime }}); it excludes uses.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?|.*[$][{][{].*)$`
	RunsOn string `json:"runsOn,omitempty"`
	// Env is the job's environment, over the WorkflowRun's.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
	// TimeoutMinutes bounds one attempt of the job; 0 means 360 (GitHub's
	// default).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=360
	TimeoutMinutes int32 `json:"timeoutMinutes,omitempty"`
	// Strategy is the job's matrix.
	// +optional
	Strategy *Strategy `json:"strategy,omitempty"`
	// RetryPolicy retries a failed attempt of the job whole (a new pod,
	// all its steps), with Stoke's retry engine.
	// +optional
	RetryPolicy *RetryPolicy `json:"retryPolicy,omitempty"`
	// Outputs are the job's outputs: name and an expression (usually over
	// steps.<id>.outputs) evaluated when the job ends.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Outputs []NameValue `json:"outputs,omitempty"`
	// Steps run in order; it excludes uses.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Steps []Step `json:"steps,omitempty"`
	// Uses names a Workflow this job calls; it excludes runsOn and steps.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Uses string `json:"uses,omitempty"`
	// With are the called Workflow's inputs (values may be expressions).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	With []NameValue `json:"with,omitempty"`
}

// Strategy is a job's matrix and how its instances run.
type Strategy struct {
	// +optional
	Matrix *Matrix `json:"matrix,omitempty"`
	// FailFast cancels the job's other instances when one fails (default
	// true, as GitHub's).
	// +optional
	FailFast *bool `json:"failFast,omitempty"`
	// MaxParallel bounds the instances running at once; 0 means all.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	MaxParallel int32 `json:"maxParallel,omitempty"`
}

// Matrix is GitHub's strategy.matrix: the product of the axes, less the
// combinations exclude matches, with include's objects merged or added
// (internal/wfexpr's ExpandMatrix says exactly how).
type Matrix struct {
	// Axes are the matrix's keys, each with its values, in order.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Axes []MatrixAxis `json:"axes,omitempty"`
	// Include are objects (key → value) merged into the combinations or
	// added as combinations of their own.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Include []apiextensionsv1.JSON `json:"include,omitempty"`
	// Exclude are objects (key → value): a combination matching one is
	// left out.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Exclude []apiextensionsv1.JSON `json:"exclude,omitempty"`
}

// MatrixAxis is one key of a matrix and its values (any JSON).
type MatrixAxis struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_-]*$`
	Name string `json:"name"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	Values []apiextensionsv1.JSON `json:"values"`
}

// Step is one step of a job: a task Run on the job's pod, in its
// workspace. Exactly one of run or uses.
//
// +kubebuilder:validation:XValidation:rule="has(self.run) != has(self.uses)",message="exactly one of run or uses must be set"
type Step struct {
	// ID names the step in steps.<id> expressions; unique in its job.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_-]*$`
	ID string `json:"id,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name,omitempty"`
	// If is an expression; unset means success().
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	If string `json:"if,omitempty"`
	// Run is the script. Expressions in it are evaluated and passed to it
	// in environment variables, never spliced into its source.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Run string `json:"run,omitempty"`
	// Shell runs run: bash (default), sh or python.
	// +optional
	// +kubebuilder:validation:Enum=bash;sh;python
	Shell string `json:"shell,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
	// WorkingDirectory is relative to the workspace, without '..' (which
	// internal/validation refuses: a regular expression over 100 steps of
	// 64 jobs is over CEL's cost budget).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	WorkingDirectory string `json:"workingDirectory,omitempty"`
	// Uses is checkout, upload-artifact or download-artifact.
	// +optional
	// +kubebuilder:validation:Enum=checkout;upload-artifact;download-artifact
	Uses string `json:"uses,omitempty"`
	// With are the uses step's parameters.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	With []NameValue `json:"with,omitempty"`
	// ContinueOnError lets the job go on when this step fails (its
	// outcome is failure, its conclusion success).
	// +optional
	ContinueOnError bool `json:"continueOnError,omitempty"`
	// TimeoutMinutes bounds the step; 0 means the job's.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=360
	TimeoutMinutes int32 `json:"timeoutMinutes,omitempty"`
}

// NameValue is a name and a value (inputs, with:, outputs).
type NameValue struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=8192
	Value string `json:"value"`
}

// GitSource is one commit of a git repository: a Run's source.git, and
// what a WorkflowRun's `uses: checkout` checks out. It is fetched once per
// commit into a cache the Runtime's pods share, then checked out into the
// Run's working directory (docs/runs.md, Git source).
//
// +kubebuilder:validation:XValidation:rule="has(self.commit) != has(self.ref)",message="exactly one of commit or ref must be set"
type GitSource struct {
	// URL of the repository: http://, https:// or git://. Credentials do
	// not belong in it (credentialsSecret, or stoke up's
	// --git-credentials).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(https?|git)://[^\s@/]+(/[^\s@]*)?$`
	URL string `json:"url"`
	// Commit is a full commit ID (40 or 64 hex digits).
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{40}|[0-9a-f]{64})$`
	Commit string `json:"commit,omitempty"`
	// Ref is a branch, a tag or a full ref (refs/…), resolved to a commit
	// once, when the Run is first materialised; status.sourceCommit
	// records it, and a retried attempt checks out that commit again.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[^-\s~^:?*\[\\][^\s~^:?*\[\\]*$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('..') && !self.contains('@{') && !self.contains('//') && !self.endsWith('/') && !self.endsWith('.') && !self.endsWith('.lock') && !self.startsWith('/') && !self.matches('(^|/)[.]') && self != '@'",message="is not a git ref: contains '..', '@{' or '//', starts or ends with '/', ends with '.' or '.lock', has an element starting with '.', or is '@'"
	Ref string `json:"ref,omitempty"`
	// Path is where in the working directory the tree goes (default the
	// working directory itself); relative, without '..'.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="must be relative to the working directory"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\x00')",message="contains a NUL byte"
	Path string `json:"path,omitempty"`
	// CredentialsSecret, in Kubernetes mode, asks for the credentials of
	// the Run's Runtime: it must name that Runtime's
	// spec.git.credentialsSecret, or the Run fails InvalidSpec (the
	// pods hold no other Secret); without it the fetch sends none. stoke
	// up takes credentials from its --git-credentials file instead, by
	// URL, and ignores this name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// WorkflowRunStatus is what happened. The bounds in internal/bounds keep
// it under 1 MiB (docs/workflows.md has the arithmetic).
type WorkflowRunStatus struct {
	// +optional
	// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Cancelled
	Phase WorkflowPhase `json:"phase,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Reason string `json:"reason,omitempty"`
	// Message is bounded (4 KiB).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Snapshot is what this run executes, resolved when it starts, so
	// that an edited Workflow does not change a running WorkflowRun.
	// +optional
	Snapshot *WorkflowSnapshot `json:"snapshot,omitempty"`
	// Jobs are the job instances (one per matrix combination).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Jobs []JobStatus `json:"jobs,omitempty"`
	// Outputs are a Workflow's outputs, evaluated when the run ends.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Outputs []NameValue `json:"outputs,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// WorkflowSnapshot is the resolved spec a WorkflowRun executes: the
// Workflow spec.workflow names (or nothing, when the run's own jobs are
// immutable anyway) and every Workflow its jobs call, as they were when
// the run started.
type WorkflowSnapshot struct {
	// Spec is spec.workflow's Workflow as it was at start.
	// +optional
	Spec *WorkflowSpec `json:"spec,omitempty"`
	// Called are the Workflows the jobs call (uses:), by name, transitively.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Called []CalledWorkflow `json:"called,omitempty"`
}

// CalledWorkflow is one Workflow a job calls, as it was at start.
type CalledWorkflow struct {
	// +kubebuilder:validation:MaxLength=63
	Name string       `json:"name"`
	Spec WorkflowSpec `json:"spec"`
}

// JobStatus is one job instance: a job, or one matrix combination of it.
type JobStatus struct {
	// Name is the job's ID, or "id (v1, v2)" for a matrix instance, as
	// GitHub names them (wfexpr.JobName).
	// +kubebuilder:validation:MaxLength=512
	Name string `json:"name"`
	// Job is the job's ID in the spec; a called Workflow's job has its
	// calling job's ID before it ("call/build", "outer/inner/build").
	// +kubebuilder:validation:MaxLength=255
	Job string `json:"job"`
	// Matrix is this instance's combination: key → the value's JSON.
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Matrix map[string]string `json:"matrix,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Skipped;Cancelled
	Phase JobPhase `json:"phase,omitempty"`
	// Attempt is 1-based: a retry of the job starts the next.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// Pod and PodUID are the runtime pod the steps run on.
	// +optional
	Pod string `json:"pod,omitempty"`
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Outputs are the job's outputs, evaluated when it ends.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Outputs []NameValue `json:"outputs,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// Steps are this attempt's steps, in order.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Steps []StepStatus `json:"steps,omitempty"`
}

// StepStatus is one step of a job instance's current attempt. Its outputs
// are in its Run's status (run), not here: copying them would put the
// WorkflowRun's status over etcd's object bound (docs/workflows.md).
type StepStatus struct {
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	ID string `json:"id,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Skipped;Cancelled
	Phase JobPhase `json:"phase,omitempty"`
	// Outcome and Conclusion are GitHub's: success, failure, cancelled
	// or skipped; they differ when continueOnError turns a failure into
	// a success.
	// +optional
	// +kubebuilder:validation:Enum=success;failure;cancelled;skipped
	Outcome string `json:"outcome,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=success;failure;cancelled;skipped
	Conclusion string `json:"conclusion,omitempty"`
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// Run is the step Run's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Run string `json:"run,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// WorkflowRunList is a list of WorkflowRuns.
//
// +kubebuilder:object:root=true
type WorkflowRunList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkflowRun `json:"items"`
}

// Workflow is a reusable workflow: typed inputs, jobs and outputs, run by
// a WorkflowRun's spec.workflow or called by a job's uses.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=wf
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Workflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkflowSpec   `json:"spec"`
	Status WorkflowStatus `json:"status,omitempty"`
}

// WorkflowStatus is what the workflow controller last saw of a Workflow.
// It is small on purpose; it exists so that a Workflow is stored as every
// other kind is (spec and status written apart, store.StatusWriter).
type WorkflowStatus struct {
	// ObservedGeneration is the generation last looked at.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WorkflowSpec is a reusable workflow's definition.
type WorkflowSpec struct {
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Inputs []WorkflowInput `json:"inputs,omitempty"`
	// Outputs are expressions over jobs.<id>.outputs.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Outputs []NameValue `json:"outputs,omitempty"`
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Jobs []Job `json:"jobs"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Env []EnvVar `json:"env,omitempty"`
}

// WorkflowInput is one typed input of a Workflow.
type WorkflowInput struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_-]*$`
	Name string `json:"name"`
	// Type is string (default), number or boolean.
	// +optional
	// +kubebuilder:validation:Enum=string;number;boolean
	Type string `json:"type,omitempty"`
	// +optional
	Required bool `json:"required,omitempty"`
	// Default is the value when the caller gives none.
	// +optional
	// +kubebuilder:validation:MaxLength=8192
	Default string `json:"default,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Description string `json:"description,omitempty"`
}

// WorkflowList is a list of Workflows.
//
// +kubebuilder:object:root=true
type WorkflowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Workflow `json:"items"`
}
