package lambda

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/runtime"
)

// A task on Lambda runs through a relay: the core starts `stoke
// lambda-relay` as the task's process, in the Run's working directory and
// env, so that it keeps every rule of one-shot execution (timeout, cancel,
// captured output, $STOKE_OUTPUTS, exit code). The relay hands the task to
// the Runtime Server over a Unix socket in a private directory; the server
// packages and invokes it and answers with the task's end, which the relay
// replays as its own output and exit code. Killing the relay (timeout,
// cancel) closes the connection and ends the invocation on Stoke's side.
// Lambda has no way to stop a running invocation, so the task is given its
// deadline in the event: the bootstrap kills its process group there, a
// moment after Stoke's own (taskSlack), and the function's timeout is the
// task's, not Lambda's 15 minutes. A cancelled task would run on in Lambda until
// that deadline, unless the agent the invocation hosts (agent.go) kills it:
// a cancel, or the core's timeout, kills the relay, and the server tells
// the task's agent to kill the task's process group, which ends the
// invocation.

// taskSlack is how long after Stoke's deadline the bootstrap kills a task:
// the core's timer, which ends the relay at the deadline, decides the
// Run's state (TIMED_OUT), not an answer that would race it.
const taskSlack = time.Second

// taskAnswerRoom is a task function's timeout beyond the task's deadline:
// the bootstrap's rounding to whole seconds, its kill grace and its answer,
// so that the bootstrap, not Lambda, ends a task that overruns.
const taskAnswerRoom = 3 * time.Second

// relayRequest is what the relay sends.
type relayRequest struct {
	WorkingDir string   `json:"workingDir"`
	Env        []string `json:"env"`
	Entrypoint string   `json:"entrypoint,omitempty"`
	Args       []string `json:"args,omitempty"`
	// TimeoutMillis is the task's timeout, which the core enforces on the
	// relay; 0 means the Runtime Server's TaskTimeout.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// relayResponse is what the server answers.
type relayResponse struct {
	Task    *payload.TaskResult `json:"task,omitempty"`
	Outputs map[string]string   `json:"outputs,omitempty"`
	Error   string              `json:"error,omitempty"`
	// SetupFailed: Error came before the task's invocation was sent (the
	// package, CreateFunction, waiting until Active): the task never ran.
	SetupFailed bool `json:"setupFailed,omitempty"`
}

// setupError is a failure of runTask before the invocation is sent.
type setupError struct{ err error }

func (e *setupError) Error() string { return e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

type relay struct {
	s      *Server
	dir    string
	sock   string
	lis    net.Listener
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

func newRelay(s *Server, stateDir string) (*relay, error) {
	if stateDir != "" {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, fmt.Errorf("lambda relay: %w", err)
		}
	}
	dir, err := os.MkdirTemp(stateDir, "lambda-")
	if err != nil {
		return nil, fmt.Errorf("lambda relay: %w", err)
	}
	sock := filepath.Join(dir, "relay.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("lambda relay: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{s: s, dir: dir, sock: sock, lis: lis, ctx: ctx, cancel: cancel}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *relay) close() error {
	err := r.lis.Close()
	r.cancel()
	r.wg.Wait()
	os.RemoveAll(r.dir)
	return err
}

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		conn, err := r.lis.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer conn.Close()
			r.handle(conn)
		}()
	}
}

func (r *relay) handle(conn net.Conn) {
	br := bufio.NewReader(io.LimitReader(conn, 4<<20))
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	var req relayRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeRelay(conn, relayResponse{Error: "bad relay request: " + err.Error()})
		return
	}
	// The relay says nothing more: EOF means it was killed.
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, br)
		cancel()
	}()
	resp, err := r.s.runTask(ctx, req)
	if err != nil {
		var se *setupError
		resp = relayResponse{Error: err.Error(), SetupFailed: errors.As(err, &se)}
	}
	writeRelay(conn, resp)
}

func writeRelay(w io.Writer, resp relayResponse) {
	b, _ := json.Marshal(resp)
	_, _ = w.Write(append(b, '\n'))
}

// TaskCommand is the relay's argv; it carries the task's timeout to the
// invocation.
func (s *Server) TaskCommand(entrypoint string, args []string, timeout time.Duration) ([]string, error) {
	argv := []string{s.cfg.Relay, "lambda-relay", "--socket", s.relay.sock}
	if timeout > 0 {
		argv = append(argv, "--timeout", timeout.String())
	}
	if entrypoint != "" {
		argv = append(argv, "--entrypoint", entrypoint)
	}
	return append(append(argv, "--"), args...), nil
}

// runTask packages the working directory as a task function and runs the
// task in one invocation, bounded by the task's timeout.
func (s *Server) runTask(ctx context.Context, req relayRequest) (relayResponse, error) {
	// runtimed names a Run's working directory by its UID.
	uid := filepath.Base(req.WorkingDir)
	timeout := time.Duration(req.TimeoutMillis) * time.Millisecond
	if timeout <= 0 || timeout > s.cfg.TaskTimeout {
		timeout = s.cfg.TaskTimeout
	}
	// Stoke's deadline counts from the relay's start, this one from now, a
	// little later, and taskSlack after it.
	deadline := time.Now().Add(timeout + taskSlack)
	// A task of a shared workspace holds its invocation after it ends, for
	// the copy of its directory back (writeback.go).
	writeBack := s.writesBack(req.WorkingDir)
	answerRoom := taskAnswerRoom
	if writeBack {
		answerRoom += writeBackRoom
	}
	fnTimeout := min(s.cfg.TaskTimeout, (timeout + taskSlack + answerRoom + time.Second - 1).Truncate(time.Second))
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(answerRoom))
	defer cancel()
	env := map[string]string{}
	for k, v := range userEnv(req.Env, req.WorkingDir) {
		if k != "STOKE_OUTPUTS" && k != runtime.EnvSetupFailure { // the relay's, not the task's
			env[k] = v
		}
	}
	p, err := s.build(ctx, req.WorkingDir, s.spec("", env, int32(fnTimeout/time.Second)))
	if err != nil {
		return relayResponse{}, &setupError{fmt.Errorf("task %s: %w", uid, err)}
	}
	if err := s.acquire(ctx, p, uid); err != nil {
		return relayResponse{}, &setupError{fmt.Errorf("task %s: %w", uid, err)}
	}
	released := false
	defer func() {
		if !released {
			s.release(p.name)
		}
	}()
	left := time.Until(deadline)
	if left <= 0 {
		return relayResponse{}, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "task %s: its timeout passed before Lambda could run it", uid)
	}
	// The invocation carries a grant for its agent, valid until the
	// function's timeout: exec into the task, and its cancel, go through
	// the agent.
	grant, creds := s.taskGrant(req.WorkingDir, uid, time.Now().Add(fnTimeout))
	ev, err := json.Marshal(payload.Request{Kind: payload.KindTask, TimeoutMillis: max(1, left.Milliseconds()),
		Task: &payload.Task{Entrypoint: req.Entrypoint, Args: req.Args, WriteBack: writeBack}, Agent: creds})
	if err != nil {
		s.dropTaskGrant(req.WorkingDir, grant)
		return relayResponse{}, err
	}
	// Not on a warm goroutine: a task may hold one for minutes. The call
	// outlives a cancel (the relay killed), which the agent turns into a
	// kill of the task in the sandbox, so that the invocation ends; the
	// function is deleted after it.
	type answer struct {
		out *awslambda.InvokeOutput
		err error
		// wrote is the write-back's end (nil when there is none).
		wrote error
	}
	answered := make(chan answer, 1)
	ictx, icancel := context.WithDeadline(s.bgCtx, deadline.Add(answerRoom))
	// The write-back's copy stops with the Run (a cancel, the timeout).
	copyCtx, stopCopy := context.WithCancel(ictx)
	released = true // by the invocation's goroutine
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer icancel()
		defer stopCopy()
		defer s.release(p.name)
		defer s.dropTaskGrant(req.WorkingDir, grant)
		start := time.Now()
		if s.cfg.Observe != nil {
			go func() {
				if grant.Await(ictx) == nil {
					s.observe("agent", start)
					s.cfg.Observe("agent-in-sandbox", grant.StartedAfter())
				}
			}()
		}
		var wrote chan error
		wctx, wcancel := context.WithCancel(ictx)
		defer wcancel()
		if writeBack {
			wrote = make(chan error, 1)
			go func() { wrote <- s.writeBack(wctx, copyCtx, grant, req.WorkingDir, uid, p.deps) }()
		}
		out, err := s.inv.Invoke(ictx, &awslambda.InvokeInput{FunctionName: aws.String(p.name), Payload: ev})
		s.observe("task", start)
		a := answer{out: out, err: err}
		if wrote != nil {
			wcancel() // it is over already unless the invocation failed
			a.wrote = <-wrote
		}
		answered <- a
	}()
	var a answer
	select {
	case a = <-answered:
	case <-ctx.Done():
		stopCopy()
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.killTask(grant, uid)
		}()
		return relayResponse{}, fmt.Errorf("task %s: %w", uid, ctx.Err())
	}
	if a.err != nil {
		return relayResponse{}, fmt.Errorf("task %s: %w", uid, awsError("Invoke", a.err))
	}
	resp, err := decode(a.out)
	if err != nil {
		return relayResponse{}, err
	}
	if resp.Task == nil {
		return relayResponse{}, errdefs.Errorf(errdefs.ErrInternal, "lambda: the task's answer has no result")
	}
	if a.wrote != nil {
		// The step fails, with what it printed, saying why: the job's
		// next step would not see what this one wrote.
		msg := a.wrote.Error()
		if resp.Task.Message != "" {
			msg = resp.Task.Message + "; and " + msg
		}
		resp.Task.State, resp.Task.Message = "EXECUTION_STATE_FAILED", msg
		if resp.Task.ExitCode == 0 {
			resp.Task.ExitCode = 1
		}
	}
	if notice := grant.Expired(); notice != "" && resp.Task.State != "EXECUTION_STATE_SUCCEEDED" {
		// What ended it: the invocation's deadline, which the agent
		// announced (the seed's lifetime_expired).
		resp.Task.Message = notice + ": " + resp.Task.Message
	}
	return relayResponse{Task: resp.Task, Outputs: resp.Outputs}, nil
}

// setupFailed tells the core, through the file it named
// ($STOKE_SETUP_FAILURE), that the task never ran because its function
// could not be set up, and returns err.
func setupFailed(err error) error {
	if f := os.Getenv(runtime.EnvSetupFailure); f != "" {
		if werr := os.WriteFile(f, []byte(bounds.Truncate(err.Error(), bounds.Message)), 0o600); werr != nil {
			return fmt.Errorf("%w (and telling the runtime server failed: %v)", err, werr)
		}
	}
	return err
}

// exitTerminated is the shell's exit code of a program that SIGTERM ended
// (proc.ExitCode), the relay's when it is stopped.
const exitTerminated = 128 + int(syscall.SIGTERM)

// Relay is the relay process's side (`stoke lambda-relay`): it sends the
// task to the Runtime Server at socket and replays its end on stdout,
// stderr, $STOKE_OUTPUTS and the returned exit code.
func Relay(ctx context.Context, socket, entrypoint string, timeout time.Duration, args []string, stdout, stderr io.Writer) (int, error) {
	wd, err := os.Getwd()
	if err != nil {
		return 1, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		err = fmt.Errorf("lambda relay: the runtime server cannot be reached: %w", err)
		return 1, setupFailed(err)
	}
	defer conn.Close()
	// Cancel and timeout end the relay with SIGTERM, which ends ctx:
	// closing the connection then ends the Runtime Server's side of the
	// task at once, whatever AWS call it is waiting on (a CreateFunction
	// that hangs), and the relay exits as a program that SIGTERM ended,
	// without using the core's kill grace; the server then has the task
	// killed in its sandbox by its agent.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	b, _ := json.Marshal(relayRequest{WorkingDir: wd, Env: os.Environ(), Entrypoint: entrypoint, Args: args, TimeoutMillis: timeout.Milliseconds()})
	if _, err := conn.Write(append(b, '\n')); err != nil {
		if ctx.Err() != nil {
			return exitTerminated, nil
		}
		return 1, fmt.Errorf("lambda relay: %w", err)
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 4*bounds.CapturedStream)).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return exitTerminated, nil
		}
		return 1, fmt.Errorf("lambda relay: no answer from the runtime server: %w", err)
	}
	var resp relayResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return 1, fmt.Errorf("lambda relay: %w", err)
	}
	if resp.Error != "" {
		if resp.SetupFailed {
			return 1, setupFailed(errors.New(resp.Error))
		}
		return 1, errors.New(resp.Error)
	}
	_, _ = io.WriteString(stdout, resp.Task.Stdout)
	_, _ = io.WriteString(stderr, resp.Task.Stderr)
	if resp.Task.Message != "" && resp.Task.ExitCode != 0 {
		// Why it failed, as the sandbox saw it (no space left, the
		// invocation's deadline), at the end of the task's stderr.
		_, _ = io.WriteString(stderr, "stoke: "+resp.Task.Message+"\n")
	}
	if f := os.Getenv("STOKE_OUTPUTS"); f != "" && len(resp.Outputs) > 0 {
		if err := outputs.Validate(resp.Outputs); err != nil {
			return 1, err
		}
		var sb strings.Builder
		for k, v := range resp.Outputs {
			sb.WriteString(k + "=" + v + "\n")
		}
		if err := os.WriteFile(f, []byte(sb.String()), 0o600); err != nil {
			return 1, err
		}
	}
	if resp.Task.Message != "" && resp.Task.ExitCode == 0 && resp.Task.State != "EXECUTION_STATE_SUCCEEDED" {
		return 1, errors.New(resp.Task.Message)
	}
	return int(resp.Task.ExitCode), nil
}

// RelaysTasks is true: a task's process only relays it (runtime.Relayer),
// and a failure to set up its function is not the task's.
func (s *Server) RelaysTasks() bool { return true }

var (
	_ runtime.Adapter       = (*Server)(nil)
	_ runtime.Relayer       = (*Server)(nil)
	_ runtime.AgentReporter = (*Server)(nil)
)
