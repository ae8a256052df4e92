package client

import (
	"context"
	"fmt"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/exec"
)

// API is what the stoke CLI does with Stoke, whichever backend serves it:
// *Client for a standalone `stoke up` (its HTTP API), and the cluster
// backend (internal/client/cluster) for Kubernetes mode, where Runs and
// Runtimes go through the Kubernetes API server and invoke, exec and logs
// through the gateway. Both answer in the same types, with the same
// watch semantics and the same errdefs categories, so that every command
// is one piece of code for both.
type API interface {
	Runs
	Runtimes
	Functions
	Workflows
	Dataplane
	Artifacts
	// Target says which backend this is and where it is, for notes,
	// errors and `stoke version`.
	Target() Target
}

// Runs are the calls on Run objects.
type Runs interface {
	// CreateRun creates run in its namespace (default when empty); a Run
	// with generateName and no name gets a generated one. A name that
	// exists wraps errdefs.ErrAlreadyExists; a Runtime that does not
	// exist is errdefs.ErrInvalidArgument.
	CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error)
	// GetRun returns one Run.
	GetRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error)
	// ListRuns lists the Runs in ns, or in every namespace when ns is "".
	ListRuns(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.RunList, error)
	// WatchRuns watches the Runs in ns (every namespace when ""): from
	// opts.ResourceVersion when set (errdefs.ErrExpired when too old),
	// else an ADDED event for each existing Run first. A deleted Run is a
	// Deleted event. The caller closes the watch.
	WatchRuns(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Run], error)
	// CancelRun sets spec.cancelRequested and returns the Run.
	CancelRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error)
	// DeleteRun deletes a Run (a function drains and unregisters first)
	// and returns it as it was.
	DeleteRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error)
}

// Runtimes are the calls on Runtime objects.
type Runtimes interface {
	// ApplyRuntime creates or updates a Runtime and returns it as stored.
	ApplyRuntime(ctx context.Context, rt *v1alpha1.Runtime) (*v1alpha1.Runtime, error)
	GetRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error)
	ListRuntimes(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.RuntimeList, error)
	WatchRuntimes(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Runtime], error)
	DeleteRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error)
}

// Workflows are the calls on WorkflowRun and Workflow objects.
type Workflows interface {
	// CreateWorkflowRun creates a WorkflowRun (metadata.generateName
	// works); the workflow controller runs it.
	CreateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error)
	GetWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error)
	ListWorkflowRuns(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.WorkflowRunList, error)
	WatchWorkflowRuns(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.WorkflowRun], error)
	// CancelWorkflowRun sets spec.cancelRequested and returns the
	// WorkflowRun.
	CancelWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error)
	DeleteWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error)
	// ApplyWorkflow creates a Workflow or replaces its spec and labels.
	ApplyWorkflow(ctx context.Context, w *v1alpha1.Workflow) (*v1alpha1.Workflow, error)
	GetWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error)
	ListWorkflows(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.WorkflowList, error)
	WatchWorkflows(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Workflow], error)
	DeleteWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error)
}

// Functions are the calls on Function objects.
type Functions interface {
	// CreateFunction creates a Function; a name that exists wraps
	// errdefs.ErrAlreadyExists.
	CreateFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error)
	// ApplyFunction creates a Function or replaces its spec and labels
	// (an unset spec.replicas keeps the stored one) and returns it as
	// stored.
	ApplyFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error)
	GetFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error)
	ListFunctions(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.FunctionList, error)
	WatchFunctions(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Function], error)
	DeleteFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error)
}

// Dataplane are the calls that reach a Run itself, through a gateway.
type Dataplane interface {
	// Logs opens a Run's log; with follow it stays open until the Run is
	// terminal and its last records are written.
	Logs(ctx context.Context, ns, name string, follow bool) (*LogStream, error)
	// Invoke calls a Ready function Run once; it is never retried.
	Invoke(ctx context.Context, ns, name, uid string, input []byte, opts InvokeOptions) (*InvokeResult, error)
	// InvokeFunction calls a Function once through its stable URL (one of
	// its replicas answers); it is never retried. No such Function is
	// NotFound.
	InvokeFunction(ctx context.Context, ns, name string, input []byte, opts InvokeOptions) (*InvokeResult, error)
	// Exec is an exec.Executor whose Request.RunUID is "namespace/name".
	Exec() exec.Executor
	// InvokeURL is the URL a Ready function answers at from where the
	// CLI runs: its status.endpoint, a path resolved against the gateway.
	InvokeURL(run *v1alpha1.Run) string
}

// Mode is which kind of backend a client talks to.
type Mode string

// Modes.
const (
	// Standalone is a `stoke up`, through its HTTP API.
	Standalone Mode = "standalone"
	// Cluster is Kubernetes mode, through a kubeconfig context.
	Cluster Mode = "cluster"
)

// Target says where a client goes.
type Target struct {
	Mode Mode
	// Server is the standalone API's URL, or the Kubernetes API server's.
	Server string
	// Context is the kubeconfig context (Cluster).
	Context string
	// Gateway is where invoke, exec and logs go (Cluster): the API
	// server's aggregated API of the gateway, or --gateway.
	Gateway string
	// Why says how the backend was chosen ("--server", "KUBECONFIG is set
	// and no token of a local stoke up was found", ...).
	Why string
}

// String describes the target in one line: "standalone http://...",
// "cluster (context kind-a, API server https://..., gateway ...)".
func (t Target) String() string {
	s := string(t.Mode)
	switch t.Mode {
	case Cluster:
		s += fmt.Sprintf(" (context %q, API server %s, gateway %s)", t.Context, t.Server, t.Gateway)
	default:
		s += " " + t.Server
	}
	if t.Why != "" {
		s += ", chosen by " + t.Why
	}
	return s
}

var _ API = (*Client)(nil)

// Target implements API.
func (c *Client) Target() Target {
	return Target{Mode: Standalone, Server: c.Server(), Why: c.why}
}
