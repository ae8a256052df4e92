// Package bootstrap is the stoke binary's Lambda role: run as `bootstrap`
// in a provided.al2023 function, it serves the Lambda Runtime API loop
// (next, then response or error; init/error when the handler cannot load)
// and runs each invocation with Stoke's own Bash or Python adapter through
// the shared core in internal/runtime, in-process. The handler is
// registered once at init and stays warm across invocations, so a function
// behaves exactly as on a runtime pod: the same handler syntax, context,
// outputs and error shape.
//
// Each event is a payload.Request. The loop reads one event at a time (Lambda
// sends a sandbox one invocation at a time) and has one dispatch point. A
// task's event, and an exec sandbox's, make the bootstrap serve exec's
// reverse agent (internal/exec/agent) while it runs.
package bootstrap

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runtime/bash"
	"stoke.dev/stoke/internal/runtime/python"
)

// deadlineMargin is kept back from Lambda's deadline, so that an
// invocation that runs out of time is ended and answered by Stoke (a clean
// Stoke.Timeout) before Lambda kills the sandbox.
const deadlineMargin = 100 * time.Millisecond

// taskKillGrace is a timed-out task's SIGTERM→SIGKILL grace in the sandbox,
// short because Lambda's own timeout follows.
const taskKillGrace = time.Second

// Config is what Lambda tells the bootstrap through its environment.
type Config struct {
	RuntimeAPI string // AWS_LAMBDA_RUNTIME_API, host:port
	TaskRoot   string // LAMBDA_TASK_ROOT: the unpacked package
	Handler    string // _HANDLER; empty for a task function
	Runtime    string // payload.EnvRuntime: bash or python
	// FunctionName (AWS_LAMBDA_FUNCTION_NAME) names the registration in logs.
	FunctionName string
	// Env is the sandbox's environment ("K=V"), from which the handler
	// gets the Run's own variables and Lambda's AWS_* and LAMBDA_* ones.
	Env []string
	// TmpDir is the writable scratch space (/tmp on Lambda).
	TmpDir string
	Python string // interpreter for the python runtime; default python3
	Logger *slog.Logger
}

// ConfigFromEnv reads Config from the sandbox's environment.
func ConfigFromEnv(env []string) Config {
	get := func(k string) string {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	tmp := get("TMPDIR")
	if tmp == "" {
		tmp = "/tmp"
	}
	return Config{
		RuntimeAPI:   get("AWS_LAMBDA_RUNTIME_API"),
		TaskRoot:     get("LAMBDA_TASK_ROOT"),
		Handler:      cmp.Or(get("_HANDLER"), get(payload.EnvHandler)),
		Runtime:      get(payload.EnvRuntime),
		FunctionName: get("AWS_LAMBDA_FUNCTION_NAME"),
		Env:          env,
		TmpDir:       tmp,
	}
}

// handlerEnv splits the sandbox's environment into what handlers see:
// the Run's own variables (named in payload.EnvUserKeys), the
// registration's env, within the Run's bounds as on a pod; and Lambda's
// AWS_* and LAMBDA_* ones but the Runtime API address, which belongs to the
// bootstrap, as the core's base environment, outside those bounds.
func handlerEnv(env []string) (user, lambda map[string]string) {
	user, lambda = map[string]string{}, map[string]string{}
	var keys []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, payload.EnvUserKeys+"="); ok && v != "" {
			keys = strings.Split(v, ",")
		}
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case slices.Contains(keys, k):
			user[k] = v
		case k == "AWS_LAMBDA_RUNTIME_API":
		case strings.HasPrefix(k, "AWS_"), strings.HasPrefix(k, "LAMBDA_"):
			lambda[k] = v
		}
	}
	return user, lambda
}

// Bootstrap is one sandbox's runtime: the core tables and the registered
// function.
type Bootstrap struct {
	cfg   Config
	log   *slog.Logger
	api   *apiClient
	env   map[string]string  // the Run's own
	base  map[string]string  // Lambda's
	fns   *runtime.Functions // nil for a task function
	reg   *pb.FunctionRegistration
	tasks *runtime.Tasks
	// held runs write-back tasks, in copies of the package under
	// heldRoot (writeback.go).
	held     *runtime.Tasks
	heldRoot string
}

// Run initialises the sandbox's runtime and serves invocations until ctx
// ends or the Runtime API fails. An init failure is reported with
// init/error and returned.
func Run(ctx context.Context, cfg Config) error {
	b, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()
	return b.loop(ctx)
}

func start(ctx context.Context, cfg Config) (*Bootstrap, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RuntimeAPI == "" {
		return nil, errors.New("bootstrap: AWS_LAMBDA_RUNTIME_API is not set: run as bootstrap only inside Lambda")
	}
	b := &Bootstrap{cfg: cfg, log: cfg.Logger.With("function", cfg.FunctionName), api: newAPIClient(cfg.RuntimeAPI)}
	b.env, b.base = handlerEnv(cfg.Env)
	if err := b.init(ctx); err != nil {
		b.close()
		e := payload.Error{Type: payload.ErrorInit, Message: err.Error()}
		if perr := b.api.initError(ctx, e); perr != nil {
			b.log.Error("reporting the init error failed", "error", perr)
		}
		return nil, fmt.Errorf("bootstrap init: %w", err)
	}
	return b, nil
}

func (b *Bootstrap) init(ctx context.Context) error {
	var adapter runtime.Adapter
	switch b.cfg.Runtime {
	case "bash":
		adapter = bash.New(bash.Config{})
	case "python":
		interp, err := python.ResolveInterpreter(ctx, cmp.Or(b.cfg.Python, "python3"))
		if err != nil {
			return err
		}
		adapter = python.New(python.Config{Interpreter: interp})
	default:
		return fmt.Errorf("unknown runtime %q in %s: want bash or python", b.cfg.Runtime, payload.EnvRuntime)
	}
	ws, err := runtime.NewWorkspace(b.cfg.TaskRoot)
	if err != nil {
		return err
	}
	scratch := filepath.Join(b.cfg.TmpDir, "stoke")
	b.tasks, err = runtime.NewTasks(runtime.TasksConfig{Adapter: adapter, Workspace: ws,
		ScratchRoot: filepath.Join(scratch, "tasks"), Logger: b.log, KillGrace: taskKillGrace, BaseEnv: b.base})
	if err != nil {
		return err
	}
	if err := b.initHeld(adapter, scratch); err != nil {
		return err
	}
	if b.cfg.Handler == "" || b.cfg.Handler == payload.TaskHandler {
		return nil
	}
	b.fns, err = runtime.NewFunctions(runtime.FunctionsConfig{Adapter: adapter, Workspace: ws,
		ScratchRoot: filepath.Join(scratch, "functions"), Logger: b.log, BaseEnv: b.base})
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(b.cfg.Runtime + "\x00" + b.cfg.Handler))
	resp, err := b.fns.RegisterFunction(ctx, &pb.RegisterFunctionRequest{
		RunUid:              cmp.Or(b.cfg.FunctionName, "lambda"),
		RegistrationAttempt: 1,
		WorkingDir:          ws.Root(),
		Handler:             b.cfg.Handler,
		Env:                 b.env,
		RegistrationDigest:  "sha256:" + hex.EncodeToString(sum[:]),
	})
	if err != nil {
		return err
	}
	b.reg = resp.GetRegistration()
	st, err := b.fns.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: b.reg})
	if err != nil {
		return err
	}
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		return errors.New(cmp.Or(st.GetFatalError(), "handler did not load"))
	}
	b.log.Info("handler loaded", "runtime", b.cfg.Runtime, "handler", b.cfg.Handler)
	return nil
}

func (b *Bootstrap) close() {
	if b.fns != nil {
		b.fns.Close(0)
	}
	if b.tasks != nil {
		b.tasks.Close(0)
	}
	if b.held != nil {
		b.held.Close(0)
	}
}

// loop serves invocations one at a time.
func (b *Bootstrap) loop(ctx context.Context) error {
	for {
		ev, err := b.api.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if ev.requestID == "" {
				return err
			}
			b.answer(ctx, ev.requestID, nil, &payload.Error{Type: payload.ErrorBadRequest, Message: err.Error()})
			continue
		}
		resp, perr := b.dispatch(ctx, ev)
		b.answer(ctx, ev.requestID, resp, perr)
	}
}

func (b *Bootstrap) answer(ctx context.Context, requestID string, resp *payload.Response, perr *payload.Error) {
	var err error
	if perr != nil {
		err = b.api.fail(ctx, requestID, *perr)
	} else {
		err = b.api.respond(ctx, requestID, resp)
	}
	if err != nil {
		b.log.Error("posting the answer failed", "request_id", requestID, "error", err)
	}
}

// dispatch runs one event.
func (b *Bootstrap) dispatch(ctx context.Context, ev event) (*payload.Response, *payload.Error) {
	var req payload.Request
	if err := json.Unmarshal(ev.body, &req); err != nil {
		return nil, &payload.Error{Type: payload.ErrorBadRequest, Message: "event is not a Stoke request: " + err.Error()}
	}
	if !ev.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ev.deadline.Add(-deadlineMargin))
		defer cancel()
	}
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}
	switch req.Kind {
	case payload.KindPing:
		return &payload.Response{}, nil
	case payload.KindInvoke:
		return b.invoke(ctx, ev.requestID, req)
	case payload.KindTask:
		return b.task(ctx, ev, req)
	case payload.KindAgent:
		return b.sandbox(ctx, ev, req)
	}
	return nil, &payload.Error{Type: payload.ErrorBadRequest, Message: fmt.Sprintf("unknown request kind %q", req.Kind)}
}

func (b *Bootstrap) invoke(ctx context.Context, requestID string, req payload.Request) (*payload.Response, *payload.Error) {
	if b.fns == nil {
		return nil, &payload.Error{Type: payload.ErrorBadRequest, Message: "this function has no handler: it runs tasks"}
	}
	var timeoutMillis int64
	if d, ok := ctx.Deadline(); ok {
		timeoutMillis = max(1, time.Until(d).Milliseconds())
	}
	invID := cmp.Or(req.InvocationID, requestID)
	resp, err := b.fns.InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration:  b.reg,
		InvocationId:  invID,
		Input:         req.Input,
		ContentType:   "application/json",
		TimeoutMillis: timeoutMillis,
	})
	if err != nil {
		return nil, errorPayload(err)
	}
	return &payload.Response{Output: resp.GetOutput(), Outputs: resp.GetOutputs()}, nil
}

// errorPayload turns an invocation error of the core into Lambda's error
// document: a handler failure keeps its type, message and stack trace.
func errorPayload(err error) *payload.Error {
	var fe *errdefs.FunctionError
	switch {
	case errors.As(err, &fe):
		e := &payload.Error{Type: fe.Type, Message: fe.Message}
		if fe.StackTrace != "" {
			e.StackTrace = strings.Split(strings.TrimRight(fe.StackTrace, "\n"), "\n")
		}
		return e
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return &payload.Error{Type: payload.ErrorTimeout, Message: err.Error()}
	case errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrTooLarge):
		return &payload.Error{Type: payload.ErrorBadRequest, Message: err.Error()}
	}
	return &payload.Error{Type: payload.ErrorNotReady, Message: err.Error()}
}

// task runs a one-shot task. Its timeout is Stoke's (the request's
// TimeoutMillis), rounded up to the whole seconds Execute counts, so that
// the task never ends before the deadline Stoke gave it; but within
// Lambda's deadline, less the time to kill the task's process group and
// answer. At the timeout the core kills the group and the answer is the
// contract's TIMED_OUT result.
func (b *Bootstrap) task(ctx context.Context, ev event, req payload.Request) (*payload.Response, *payload.Error) {
	t := req.Task
	if t == nil {
		return nil, &payload.Error{Type: payload.ErrorBadRequest, Message: "task request without a task"}
	}
	requestID := ev.requestID
	secs := (req.TimeoutMillis + 999) / 1000
	if !ev.deadline.IsZero() {
		left := max(1, int64(time.Until(ev.deadline.Add(-deadlineMargin-taskKillGrace))/time.Second))
		if secs <= 0 || secs > left {
			secs = left
		}
	}
	tasks, dir := b.tasks, b.cfg.TaskRoot
	var hold *hold
	if t.WriteBack {
		var err error
		if hold, err = b.newHold(requestID); err != nil {
			return nil, errorPayload(err)
		}
		defer hold.remove()
		tasks, dir = b.held, hold.dir
	}
	if _, err := tasks.Execute(ctx, &pb.ExecuteRequest{
		Id: requestID, WorkingDir: dir, Entrypoint: t.Entrypoint, Args: t.Args,
		Env: b.env, TimeoutSeconds: secs,
	}); err != nil {
		return nil, errorPayload(err)
	}
	defer func() {
		if _, err := tasks.Forget(context.WithoutCancel(ctx), &pb.ForgetRequest{Id: requestID}); err != nil {
			b.log.Warn("forgetting the task failed", "request_id", requestID, "error", err)
		}
	}()
	stopAgent := b.taskAgent(ctx, ev, req, tasks, hold)
	defer stopAgent()
	st, err := tasks.Wait(context.WithoutCancel(ctx), &pb.StatusRequest{Id: requestID})
	if err != nil {
		return nil, errorPayload(err)
	}
	if hold != nil && req.Agent != nil {
		hold.await(ev.deadline)
	}
	msg := st.GetErrorMessage()
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED {
		msg, _ = noSpace(b.cfg.TmpDir, st.GetStderr(), msg)
	}
	return &payload.Response{Outputs: st.GetOutputs(), Task: &payload.TaskResult{
		State: st.GetState().String(), ExitCode: st.GetExitCode(),
		Stdout: st.GetStdout(), Stderr: st.GetStderr(), Message: msg,
	}}, nil
}

// LogTo is the logger a bootstrap writes: JSON lines on w, which Lambda
// sends to CloudWatch.
func LogTo(w *os.File) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, nil))
}
