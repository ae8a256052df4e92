// Package payload is the wire format between Stoke's Lambda Runtime Server
// and its bootstrap inside the function: the event of one Lambda
// invocation (a Request), its answer (a Response), and the error document
// Lambda's Runtime API carries for a failed invocation (an Error). Both
// ends import it, so that the format is defined once.
//
// The event is an envelope rather than the user's JSON itself, so that one
// function serves the kinds of call Stoke makes: a function invocation, a
// one-shot task, and a ping that proves the handler loaded. The reverse
// agent of exec adds its dial-back parameters (address and a per-invocation
// credential) as another field of Request, read by the bootstrap before it
// runs the call.
package payload

import (
	"encoding/json"
	"log/slog"
	"strconv"
)

// Kinds of Request.
const (
	// KindInvoke runs one invocation of the function's handler.
	KindInvoke = "invoke"
	// KindTask runs the function's source as a one-shot task.
	KindTask = "task"
	// KindPing answers once the handler is loaded: an init failure makes
	// it fail with the init error.
	KindPing = "ping"
	// KindAgent hosts exec's reverse agent alone, in a sandbox of the
	// function (the same code, env and working directory), until the
	// Runtime Server releases it or the invocation's timeout.
	KindAgent = "agent"
)

// Configuration the Runtime Server puts in the function's environment for
// the bootstrap; Lambda itself sets _HANDLER from the function's Handler.
const (
	// EnvRuntime names the inner runtime: bash or python.
	EnvRuntime = "STOKE_RUNTIME"
	// EnvUserKeys lists, comma-separated, which variables of the
	// function's environment are the Run's own env (the rest is Lambda's
	// and Stoke's), so that handlers see exactly what they see on a pod.
	EnvUserKeys = "STOKE_ENV_KEYS"
	// EnvHandler is an image function's handler: Lambda takes no Handler
	// for an image, so the bootstrap reads it here when _HANDLER is empty.
	EnvHandler = "STOKE_HANDLER"
	// TaskHandler is the Handler of a task function, which has none.
	TaskHandler = "stoke.task"
)

// Error types the bootstrap reports for Stoke's own failures, next to the
// handler's error types (which keep their names, e.g. ValueError).
const (
	// ErrorTimeout: the invocation reached its deadline inside the sandbox.
	ErrorTimeout = "Stoke.Timeout"
	// ErrorNotReady: the handler is not loaded (its replacement failed).
	ErrorNotReady = "Stoke.NotReady"
	// ErrorBadRequest: the event is not a Request this bootstrap knows.
	ErrorBadRequest = "Stoke.BadRequest"
	// ErrorInit is the init/error type of a handler that cannot load.
	ErrorInit = "Runtime.InitError"
)

// Request is the event of one invocation.
type Request struct {
	Kind         string `json:"stoke"`
	InvocationID string `json:"invocationId,omitempty"`
	// TimeoutMillis is the invocation's or task's own remaining timeout:
	// the bootstrap ends the handler's call, or kills the task's process
	// group, at it (or at Lambda's deadline if that comes first), so that
	// work Stoke has given up on does not go on in the sandbox, holding it
	// and running up the bill until the function's timeout.
	TimeoutMillis int64           `json:"timeoutMillis,omitempty"`
	Input         json.RawMessage `json:"input,omitempty"`
	Task          *Task           `json:"task,omitempty"`
	// Agent, on a task or an agent request, makes the bootstrap dial back
	// to the Runtime Server and serve exec sessions into the Run while the
	// invocation lasts. Its secret is valid for this invocation only and
	// is never logged.
	Agent *Agent `json:"agent,omitempty"`
}

// Agent is how the reverse agent dials back (internal/exec/agent's
// Credentials, in this format's own type).
type Agent struct {
	URL    string `json:"url"`
	ID     string `json:"id"`
	Secret string `json:"secret"`
	RunUID string `json:"runUid"`
}

// InvokeEvent is the event of a KindInvoke Request. input must be valid
// JSON (the Runtime Server's core has checked it): it is copied in as it
// is, where json.Marshal would scan and re-encode it, which for a large
// input costs more than the rest of the call, and would grow it by
// escaping <, > and & in its strings.
func InvokeEvent(invocationID string, timeoutMillis int64, input json.RawMessage) []byte {
	b := make([]byte, 0, len(input)+len(invocationID)+80)
	b = append(b, `{"stoke":"`+KindInvoke+`","invocationId":`...)
	b = appendString(b, invocationID)
	if timeoutMillis > 0 {
		b = append(b, `,"timeoutMillis":`...)
		b = strconv.AppendInt(b, timeoutMillis, 10)
	}
	b = append(b, `,"input":`...)
	b = append(b, input...)
	return append(b, '}')
}

// appendString appends s as a JSON string: as it is when it needs no
// escaping (Stoke's invocation IDs), else as json.Marshal writes it.
func appendString(b []byte, s string) []byte {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // a string: cannot fail
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Task is a one-shot execution of the function's source.
type Task struct {
	Entrypoint string   `json:"entrypoint,omitempty"`
	Args       []string `json:"args,omitempty"`
	// WriteBack: the task's source is a job's shared workspace, whose
	// changes the Runtime Server copies back. The task runs in a copy of
	// the package under the sandbox's /tmp (the task root is read-only
	// on AWS), and after it the invocation holds, its agent up, until
	// the Runtime Server has copied that directory and releases it.
	WriteBack bool `json:"writeBack,omitempty"`
}

// Response is the answer of a successful invocation.
type Response struct {
	// Output is the handler's JSON result (KindInvoke).
	Output json.RawMessage `json:"output,omitempty"`
	// Outputs are the invocation's or task's validated outputs.
	Outputs map[string]string `json:"outputs,omitempty"`
	// Task is the end of a task (KindTask).
	Task *TaskResult `json:"task,omitempty"`
}

// TaskResult is how a task ended.
type TaskResult struct {
	// State is the executor.v1 ExecutionState name, e.g.
	// EXECUTION_STATE_SUCCEEDED.
	State    string `json:"state"`
	ExitCode int32  `json:"exitCode"`
	Stdout   string `json:"stdout,omitempty"` // bounded tail
	Stderr   string `json:"stderr,omitempty"` // bounded tail
	Message  string `json:"message,omitempty"`
}

// Error is the body of a Runtime API error post and of an invocation
// answer with X-Amz-Function-Error, in the shape Lambda uses.
type Error struct {
	Type       string   `json:"errorType"`
	Message    string   `json:"errorMessage"`
	StackTrace []string `json:"stackTrace,omitempty"`
}

// LogValue keeps the secret out of any log that is handed an Agent.
func (a Agent) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", a.URL), slog.String("id", a.ID), slog.String("secret", "REDACTED"))
}
