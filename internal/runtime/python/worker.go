package python

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runuser"
)

// Response kinds; worker.py has the same constants.
const (
	kindOK        = 1
	kindError     = 2
	kindReady     = 3
	kindInitError = 4
	kindHanded    = 5 // a spare's: it has its registration (spare.go)
	kindSpare     = 6 // a spare's: started, waiting for its registration
	kindRefused   = 7 // a spare's: it cannot take that registration (spare.go)
)

const (
	reqHeaderSize  = 20 // u32 id length, u32 scope length, u32 input length, u64 remaining ns
	respHeaderSize = 5  // u32 payload length, u8 kind

	// maxTypeName bounds an exception's class name; the worker cuts it too.
	maxTypeName = 256
	// maxPayload bounds one response: the largest output and the outputs
	// with their length prefixes. An error fits as well: the worker cuts its
	// three strings to maxTypeName, bounds.Message and bounds.StackTrace
	// characters, under 100 KiB even when each becomes a 6-byte escape.
	maxPayload = 4 + bounds.InvokeBody + bounds.OutputsTotal + 8*bounds.OutputKeys

	// closeGrace is how long Close lets a worker handle SIGTERM before the
	// group is killed; an idle worker without a handler dies at once.
	closeGrace = 500 * time.Millisecond
	// exitDrain bounds how long a response is still awaited after the
	// worker exited.
	exitDrain = time.Second
	// logDrain bounds how long Close waits for the output pipes to reach
	// EOF once the group is dead: only a descendant that left the group
	// could still hold them.
	logDrain = 500 * time.Millisecond
)

// InitError is a handler that could not be loaded: the exception the worker
// raised importing its module or resolving the function (ImportError,
// SyntaxError, AttributeError, an exception at import time, ...).
type InitError struct {
	Handler   string
	Type      string // the exception class, module-qualified unless builtin
	Message   string // bounded str(exception)
	Traceback string // bounded, its end kept
}

func (e *InitError) Error() string {
	msg := fmt.Sprintf("loading handler %s: %s: %s", e.Handler, e.Type, e.Message)
	if where := lastFrame(e.Traceback); where != "" {
		msg += " (at " + where + ")"
	}
	return msg
}

// lastFrame returns the innermost `File "...", line N, in f` of a Python
// traceback: where an exception at import time was raised.
func lastFrame(tb string) string {
	i := strings.LastIndex(tb, "\n  File ")
	if i < 0 {
		return ""
	}
	line := tb[i+len("\n  "):]
	if j := strings.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	return line
}

// protocolError is a response that breaks the framing: the worker (or
// handler code that wrote to its pipes) cannot be trusted any more.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "malformed response from the python worker: " + e.msg }

// instance is one worker process serving one registration.
type instance struct {
	log    *slog.Logger
	p      *proc.Process
	req    *os.File // our end of the request pipe, the worker's fd 3
	resp   *os.File // our end of the response pipe, the worker's fd 4
	w      *bufio.Writer
	r      *bufio.Reader
	stdout *logStream
	stderr *logStream
	logs   *logStreams // both, attributed together

	// interrupt makes pending and future I/O on req and resp fail at once;
	// it runs when the context of a Load or an invocation ends.
	interrupt func()
	// releaseDeps lets the requirements cache prune this registration's
	// dependencies again (pydeps.Cache.Use); Close calls it.
	releaseDeps func()
	done        chan struct{} // closed by watch once the worker has exited
	wg          sync.WaitGroup
	closeOnce   sync.Once

	// kids are the worker's children that ran before the current call
	// (proc.KillChildrenExcept): set when the handler is loaded and after
	// each call; the core never invokes concurrently.
	kids []proc.Child
	// scan lists the worker's children from /proc files it keeps open;
	// nil if they could not be opened (then proc.Children by path).
	scan *proc.ChildScanner

	// afterFirst, if set (an instance that was a spare), is called once
	// when the first invocation has been finished; first records that.
	afterFirst func()
	first      bool
	// unfinished is a call's Finish still to do: whether it had a scope.
	unfinished, scoped bool

	// Scratch headers, reused: the core never invokes concurrently.
	reqHdr  [reqHeaderSize]byte
	respHdr [respHeaderSize]byte
}

var (
	_ runtime.Instance = (*instance)(nil)
	_ runtime.Finisher = (*instance)(nil)
)

// Load starts a worker for spec.Handler, or hands the spare one the
// registration (spare.go), and waits until it has imported the handler
// (READY) or failed to (an *InitError).
func (a *Adapter) Load(ctx context.Context, spec runtime.FunctionSpec) (runtime.Instance, error) {
	log := logging.OrDiscard(spec.Logger)
	env := spec.Env
	if env == nil {
		env = []string{} // nil would hand the worker the server's environment
	}
	// Within the registration's init bound: a first install counts. The
	// instance holds the dependencies in use until it is closed.
	deps, releaseDeps, err := a.useDeps(ctx, spec.WorkingDir)
	if err != nil {
		return nil, err
	}
	// A spare's start-up is compared without the requirements: it puts
	// their directory where PYTHONPATH would have (spare.go).
	start := a.startEnv(env)
	if deps != "" {
		env = pathFirst(env, deps)
	}
	if s := a.spares.take(ctx, spec.User, start); s != nil {
		if i, handed, err := a.handOver(ctx, s, spec, env, deps, releaseDeps); handed {
			// The next spare is made off this registration's path, which
			// runs to its first answer (a scale from zero's): answerLead
			// after its first invocation returned, or remakeAfter after
			// the handover if no invocation comes first.
			if err != nil {
				a.spares.make()
			} else {
				i.(*instance).afterFirst = a.spares.makeSoon()
			}
			return i, err
		}
	}
	// A spare that was not there (or did not fit) is made once this
	// worker has answered.
	defer a.spares.make()
	w, err := a.startWorker(spec.WorkingDir, env, spec.User,
		spec.Handler, "__STOKE_WORKDIR="+spec.WorkingDir, "__STOKE_RUN_UID="+spec.RunUID)
	if err != nil {
		releaseDeps()
		return nil, err
	}
	return a.ready(ctx, log, spec, w, releaseDeps)
}

// worker is a started worker process and the parent's ends of its pipes.
type worker struct {
	p                    *proc.Process
	req, resp, out, errp *os.File
}

func (w *worker) closeFiles() { closeAll([]*os.File{w.req, w.resp, w.out, w.errp}) }

// startWorker starts worker.py in dir with env and extra, as user, for
// handler ("" for a spare, which is handed its registration later).
func (a *Adapter) startWorker(dir string, env []string, user *runuser.User, handler string, extra ...string) (*worker, error) {
	// Parent ends first, then the worker's: reqR, respW, outW, errW.
	var pipes [8]*os.File
	for k := 0; k < len(pipes); k += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:k])
			return nil, fmt.Errorf("python worker pipes: %w", err)
		}
		pipes[k], pipes[k+1] = r, w
	}
	reqR, reqW, respR, respW := pipes[0], pipes[1], pipes[2], pipes[3]
	outR, outW, errR, errW := pipes[4], pipes[5], pipes[6], pipes[7]

	// The Run UID, and the working directory whose path holds it, go in
	// the environment, which only this user can read, not in the
	// arguments, which every user can; the worker removes them.
	cmd := exec.Command(a.interpreter, "-s", "-c", workerSource, handler,
		strconv.Itoa(bounds.InvokeBody), strconv.Itoa(bounds.OutputKeys), strconv.Itoa(bounds.OutputsTotal),
		strconv.Itoa(bounds.Message), strconv.Itoa(bounds.StackTrace))
	cmd.Dir = dir
	cmd.Env = append(slices.Clip(env), extra...)
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = []*os.File{reqR, respW}
	p, err := proc.Start(cmd, proc.AsUser(user.Credential()))
	// The worker holds its own copies now; keeping ours would hide its EOF.
	closeAll([]*os.File{reqR, respW, outW, errW})
	if err != nil {
		closeAll([]*os.File{reqW, respR, outR, errR})
		return nil, fmt.Errorf("start python worker %s: %w", a.interpreter, err)
	}
	return &worker{p: p, req: reqW, resp: respR, out: outR, errp: errR}, nil
}

// ready makes the instance of the started (or handed over) worker w, its
// output filed under the registration from here on, and waits for READY.
// The instance releases the dependencies when it is closed; ready does if
// it returns an error.
func (a *Adapter) ready(ctx context.Context, log *slog.Logger, spec runtime.FunctionSpec, w *worker, releaseDeps func()) (runtime.Instance, error) {
	out := spec.Output
	if out == nil {
		out = runtime.DiscardOutput
	}
	stdout, err1 := newLogStream("stdout", w.out, out)
	stderr, err2 := newLogStream("stderr", w.errp, out)
	if err := errors.Join(err1, err2); err != nil {
		w.p.Kill(0)
		w.closeFiles()
		releaseDeps()
		return nil, fmt.Errorf("python worker output: %w", err)
	}
	p := w.p
	i := &instance{
		log: log, p: p, req: w.req, resp: w.resp,
		// Typical requests and responses fit one system call; larger
		// ones bypass the buffers.
		w: bufio.NewWriterSize(w.req, 16<<10), r: bufio.NewReaderSize(w.resp, 16<<10),
		stdout: stdout, stderr: stderr, logs: newLogStreams(stdout, stderr),
		done: make(chan struct{}), releaseDeps: releaseDeps,
	}
	i.interrupt = func() {
		past := time.Unix(1, 0)
		_ = i.resp.SetReadDeadline(past)
		_ = i.req.SetWriteDeadline(past)
	}
	i.wg.Add(3)
	go i.watch()
	go func() { defer i.wg.Done(); stdout.pump() }()
	go func() { defer i.wg.Done(); stderr.pump() }()

	stop := context.AfterFunc(ctx, i.interrupt)
	kind, payload, err := i.readFrame()
	if !stop() {
		_ = i.Close()
		return nil, fmt.Errorf("python worker did not become ready: %w", ctx.Err())
	}
	if err != nil {
		_ = i.Close()
		var pe *protocolError
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, fmt.Errorf("python worker exited while loading %s (%s); its output is in the log", spec.Handler, i.exitStatus())
	}
	switch kind {
	case kindReady:
		log.Debug("python worker ready", "pid", p.Pid(), "python", string(payload))
		if sc, err := proc.NewChildScanner(p.Pid()); err == nil {
			i.scan = sc
			i.kids = sc.Children() // started while the handler was imported
		} else {
			i.kids = proc.Children(p.Pid())
		}
		return i, nil
	case kindInitError:
		_ = i.Close()
		typ, msg, tb, err := decodeError(payload)
		if err != nil {
			return nil, err
		}
		log.Warn("python handler failed to load", "handler", spec.Handler, "error_type", typ, "traceback", tb)
		return nil, &InitError{Handler: spec.Handler, Type: typ, Message: msg, Traceback: tb}
	default:
		_ = i.Close()
		return nil, &protocolError{fmt.Sprintf("response kind %d before READY", kind)}
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// watch closes done once the worker has exited. It first sweeps up the
// rest of the worker's process group, whose members share the protocol
// pipes, so that a read sees EOF; a descendant that left the group could
// still hide it, so reads also get a deadline, far enough away that a
// response the worker wrote just before exiting (INIT_ERROR) is still read.
func (i *instance) watch() {
	defer i.wg.Done()
	<-i.p.Done()
	i.p.Kill(0)
	_ = i.resp.SetReadDeadline(time.Now().Add(exitDrain))
	_ = i.req.SetWriteDeadline(time.Now())
	close(i.done)
	i.log.Debug("python worker exited", "pid", i.p.Pid(), "status", i.exitStatus())
}

// Finish kills what the last call started and left running (the
// handler runs in the worker, so that is the worker's child, not an
// orphan: every child that was not there before the call), once its
// answer is on its way (runtime.Finisher). What those leave behind is
// orphaned to the Runtime Server, which kills it as the invocation's
// scope has ended. It then lets a spare's first call make the next
// spare.
func (i *instance) Finish() {
	if !i.unfinished {
		return
	}
	i.unfinished = false
	if i.scoped {
		if i.scan != nil {
			i.kids = i.scan.KillExcept(i.kids)
		} else {
			i.kids = proc.KillChildrenExcept(i.p.Pid(), i.kids)
		}
	}
	if !i.first && i.afterFirst != nil { // the core never invokes concurrently
		i.first = true
		i.afterFirst()
	}
}

// exitStatus describes how the worker ended; valid once it has.
func (i *instance) exitStatus() string {
	if err := i.p.Err(); err != nil {
		return err.Error() // "exit status 3", "signal: segmentation fault"
	}
	return "exit status 0"
}

// Done is closed once the worker has exited.
func (i *instance) Done() <-chan struct{} { return i.done }

// Invoke sends one request and waits for its response. The context's end
// kills the worker's process group (and so ends the instance).
func (i *instance) Invoke(ctx context.Context, inv runtime.Invocation) (runtime.Result, error) {
	select {
	case <-i.done:
		return runtime.Result{}, errdefs.Errorf(errdefs.ErrUnavailable, "python worker is not running (%s)", i.exitStatus())
	default:
	}
	if err := ctx.Err(); err != nil {
		return runtime.Result{}, err
	}
	if len(inv.ID) > bounds.InvocationID || len(inv.Input) > bounds.InvokeBody {
		return runtime.Result{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "invocation id or input exceeds its bound")
	}
	i.Finish() // a caller that did not finish the last call
	i.logs.attribute(inv.ID)
	// What the call printed is filed under it before its answer goes:
	// who reads the Run's output after the answer finds it there.
	defer i.logs.attribute("")
	i.unfinished, i.scoped = true, inv.Scope != ""

	stop := runtime.AfterCall(ctx, i.interrupt)
	kind, payload, err := i.roundTrip(inv)
	if !stop() {
		// The context ended: whatever arrived is moot and the pipes'
		// deadlines are set, so the worker goes.
		i.kill()
		return runtime.Result{}, ctx.Err()
	}
	if err != nil {
		return runtime.Result{}, i.broken(err)
	}
	switch kind {
	case kindOK:
		res, err := decodeResult(payload)
		if err != nil {
			return runtime.Result{}, i.broken(err)
		}
		return res, nil
	case kindError:
		typ, msg, tb, err := decodeError(payload)
		if err != nil {
			return runtime.Result{}, i.broken(err)
		}
		return runtime.Result{}, &errdefs.FunctionError{Type: typ, Message: msg, StackTrace: tb, InvocationID: inv.ID}
	default:
		return runtime.Result{}, i.broken(&protocolError{fmt.Sprintf("unknown response kind %d", kind)})
	}
}

// roundTrip writes one request and reads its response.
func (i *instance) roundTrip(inv runtime.Invocation) (byte, []byte, error) {
	remaining := int64(math.MaxInt64)
	if !inv.Deadline.IsZero() {
		remaining = max(0, int64(time.Until(inv.Deadline)))
	}
	h := i.reqHdr[:]
	binary.LittleEndian.PutUint32(h[0:], uint32(len(inv.ID)))
	binary.LittleEndian.PutUint32(h[4:], uint32(len(inv.Scope)))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(inv.Input)))
	binary.LittleEndian.PutUint64(h[12:], uint64(remaining))
	_, _ = i.w.Write(h)
	_, _ = i.w.WriteString(inv.ID)
	_, _ = i.w.WriteString(inv.Scope)
	_, _ = i.w.Write(inv.Input)
	if err := i.w.Flush(); err != nil { // a bufio.Writer keeps its first error
		return 0, nil, err
	}
	return i.readFrame()
}

// readFrame reads one response. Its payload is freshly allocated: the
// output it carries outlives the call.
func (i *instance) readFrame() (byte, []byte, error) {
	if _, err := io.ReadFull(i.r, i.respHdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(i.respHdr[:4])
	if n > maxPayload {
		return 0, nil, &protocolError{fmt.Sprintf("payload of %d bytes, at most %d allowed", n, maxPayload)}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(i.r, payload); err != nil {
		return 0, nil, err
	}
	return i.respHdr[4], payload, nil
}

// broken ends an instance whose protocol failed: the worker exited (EOF, a
// broken pipe, or the deadline watch sets after the exit) or answered
// nonsense.
func (i *instance) broken(err error) error {
	i.kill()
	if pe := (*protocolError)(nil); errors.As(err, &pe) {
		return &errdefs.FunctionError{Type: errdefs.RuntimeProtocolError, Message: pe.Error() + "; the worker was stopped"}
	}
	return &errdefs.FunctionError{Type: errdefs.RuntimeExitError, Message: "python worker exited during the invocation: " + i.exitStatus()}
}

// kill kills the worker's process group at once and waits until watch has
// seen the exit, so that Done is closed when it returns. For a worker that
// already exited it only sweeps up what is left of its group.
func (i *instance) kill() {
	i.p.Kill(0)
	<-i.done
}

// Close kills the worker's process group, waits for every goroutine of the
// instance and closes the pipes. Safe to call twice.
func (i *instance) Close() error {
	i.closeOnce.Do(func() {
		i.p.Kill(closeGrace)
		<-i.done
		drain := time.Now().Add(logDrain)
		_ = i.stdout.f.SetReadDeadline(drain)
		_ = i.stderr.f.SetReadDeadline(drain)
		i.wg.Wait()
		closeAll([]*os.File{i.req, i.resp, i.stdout.f, i.stderr.f})
		if i.scan != nil {
			_ = i.scan.Close()
		}
		i.releaseDeps()
	})
	return nil
}

// decodeResult splits an OK payload into the output and the outputs map.
// Output aliases payload, which is the caller's.
func decodeResult(p []byte) (runtime.Result, error) {
	if len(p) < 4 {
		return runtime.Result{}, &protocolError{"short OK payload"}
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n > len(p) {
		return runtime.Result{}, &protocolError{"output longer than its payload"}
	}
	res := runtime.Result{Output: p[:n:n]}
	for p = p[n:]; len(p) > 0; {
		if len(p) < 8 {
			return runtime.Result{}, &protocolError{"truncated output entry"}
		}
		kl, vl := int(binary.LittleEndian.Uint32(p)), int(binary.LittleEndian.Uint32(p[4:]))
		p = p[8:]
		if kl > len(p) || vl > len(p)-kl {
			return runtime.Result{}, &protocolError{"output entry longer than its payload"}
		}
		if res.Outputs == nil {
			res.Outputs = make(map[string]string)
		}
		res.Outputs[string(p[:kl])] = string(p[kl : kl+vl])
		p = p[kl+vl:]
	}
	return res, nil
}

// decodeError reads the type, message and traceback of an ERROR or
// INIT_ERROR payload, each cut to its bound.
func decodeError(p []byte) (typ, msg, tb string, err error) {
	var s [3]string
	for k := range s {
		if len(p) < 4 {
			return "", "", "", &protocolError{"truncated error payload"}
		}
		n := int(binary.LittleEndian.Uint32(p))
		p = p[4:]
		if n > len(p) {
			return "", "", "", &protocolError{"error string longer than its payload"}
		}
		s[k] = strings.ToValidUTF8(string(p[:n]), "\uFFFD")
		p = p[n:]
	}
	return bounds.Truncate(s[0], maxTypeName), bounds.Truncate(s[1], bounds.Message), bounds.TruncateHead(s[2], bounds.StackTrace), nil
}
