// Package workflow is the workflow controller: it runs each WorkflowRun's
// DAG of jobs as task Runs on the warm pools, one Run per step.
//
// A job instance (a job, or one combination of its matrix) runs its steps
// in order in one workspace on one runtime pod: its first step Run is
// placed by the scheduler, every later one is pinned to that pod
// (spec.placement.podUID) and all name the same workspace
// (spec.placement.workspace), so files one step writes are there for the
// next. Step Runs are owned by the WorkflowRun (a controller owner
// reference), labelled with it, its job and step, and named
// deterministically from (WorkflowRun, job instance, attempt, step): a
// restarted controller finds the ones it made, and a create of one that
// exists is AlreadyExists, so no step is started twice.
//
// Everything the controller decides is in the WorkflowRun's status (each
// job's and step's phase, attempt and outputs) or in the step Runs' (a
// step's outputs and what it wrote to $GITHUB_ENV), so that it survives a
// kill -9 of stoke up or of the controller leader. The decisions are pure
// functions of (spec snapshot, status, observed step Runs, now) in
// decide.go, tested without a store; the controller (controller.go) reads
// the informers and writes what they say, on the control plane's loop kit
// (internal/loop), keyed by WorkflowRun; it runs in stoke up and in stoke
// controller alike (internal/controlplane). A finished WorkflowRun with
// ttlSecondsAfterFinished is deleted that long after it ended.
//
// Expressions (${{ }}) are evaluated by internal/wfexpr. A step's `run`
// script is the step Run's inline source (a file), never spliced shell
// source: each ${{ expr }} in it is rewritten to a reference to an
// environment variable STOKE_EXPR_<n> whose value is the expression's, as
// GitHub recommends doing by hand for untrusted values.
package workflow
