package wfexpr

import (
	"runtime"
	"strconv"
)

// Context is what an expression can read: the engine fills what the
// place it evaluates in has (a job's if: has needs, a step's has steps).
type Context struct {
	// Workflow is the `workflow` context; github.workflow, github.run_id
	// and github.run_attempt answer from it too, for copied steps.
	Workflow WorkflowInfo
	// Workspace is the job's workspace directory (github.workspace).
	Workspace string
	Env       map[string]string
	// Inputs are typed: string, float64 or bool (see Input).
	Inputs map[string]any
	// Matrix is this job instance's combination (see Combination.Values
	// and MatrixFromStatus).
	Matrix *Object
	Needs  map[string]JobResult
	Steps  map[string]StepResult
	// Jobs answers jobs.<id>.outputs in a Workflow's outputs.
	Jobs map[string]JobResult
	// Status is what success() and failure() read: "success", "failure"
	// or "cancelled" (job.status in a step; in a job's if:, whether its
	// needs all succeeded). Empty means success.
	Status string
	// Cancelled is what cancelled() reads: the WorkflowRun is cancelling.
	Cancelled bool
	// HashFiles answers hashFiles(): the digest of the files the patterns
	// (one call's, joined by newlines) name in the job's workspace. Nil
	// where hashFiles is not available (anywhere but a step's fields).
	HashFiles func(patterns string) (string, error)
}

// WorkflowInfo names a WorkflowRun and its attempt.
type WorkflowInfo struct {
	Name    string
	RunID   string
	Attempt int
}

// JobResult is a finished job as needs.<id> and jobs.<id> see it: result
// is success, failure, cancelled or skipped.
type JobResult struct {
	Result  string
	Outputs map[string]string
}

// StepResult is a finished step as steps.<id> sees it.
type StepResult struct {
	Outcome    string
	Conclusion string
	Outputs    map[string]string
}

// contextNames are the contexts an expression may name.
var contextNames = []string{"workflow", "github", "env", "inputs", "matrix", "needs", "steps", "job", "jobs", "runner", "strategy"}

var knownContexts = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range contextNames {
		m[n] = true
	}
	return m
}()

// variable is the value of a context by its (lower-cased) name.
func (c *Context) variable(name string) any {
	switch name {
	case "workflow":
		o := NewObject()
		o.Set("name", c.Workflow.Name)
		o.Set("runId", c.Workflow.RunID)
		o.Set("attempt", float64(c.Workflow.Attempt))
		return o
	case "github":
		o := NewObject()
		o.Set("workflow", c.Workflow.Name)
		o.Set("run_id", c.Workflow.RunID)
		o.Set("run_attempt", strconv.Itoa(c.Workflow.Attempt))
		o.Set("workspace", c.Workspace)
		return o
	case "runner":
		o := NewObject()
		o.Set("os", "Linux")
		o.Set("arch", map[string]string{"amd64": "X64", "arm64": "ARM64", "386": "X86", "arm": "ARM"}[runtime.GOARCH])
		return o
	case "env":
		return objectOfStrings(c.Env)
	case "inputs":
		o := NewObject()
		for _, k := range sortedKeys(c.Inputs) {
			o.Set(k, c.Inputs[k])
		}
		return o
	case "matrix":
		if c.Matrix == nil {
			return NewObject()
		}
		return c.Matrix
	case "needs":
		return jobResults(c.Needs)
	case "jobs":
		return jobResults(c.Jobs)
	case "steps":
		o := NewObject()
		for _, k := range sortedKeys(c.Steps) {
			s := c.Steps[k]
			so := NewObject()
			so.Set("outputs", objectOfStrings(s.Outputs))
			so.Set("outcome", s.Outcome)
			so.Set("conclusion", s.Conclusion)
			o.Set(k, so)
		}
		return o
	case "job":
		o := NewObject()
		o.Set("status", c.status())
		return o
	case "strategy":
		return NewObject()
	}
	return nil
}

func (c *Context) status() string {
	if c.Cancelled {
		return "cancelled"
	}
	if c.Status == "" {
		return "success"
	}
	return c.Status
}

func jobResults(m map[string]JobResult) *Object {
	o := NewObject()
	for _, k := range sortedKeys(m) {
		jo := NewObject()
		jo.Set("result", m[k].Result)
		jo.Set("outputs", objectOfStrings(m[k].Outputs))
		o.Set(k, jo)
	}
	return o
}
