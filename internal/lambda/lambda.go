// Package lambda is the Lambda Runtime Server: `stoke runtime-server
// --runtime lambda` places Runs on AWS Lambda. It is a runtime.Adapter, so
// the shared core in internal/runtime keeps every rule of the executor.v1
// contract (fencing, digests, one invocation in flight, bounds, error
// codes): loading a handler packages the Run's working directory with the
// stoke binary as bootstrap into a zip in memory, creates the function (or
// finds the one an identical registration made: the name is derived from
// the package's digest) and waits until it is Active and its handler
// loaded; an invocation is one synchronous Invoke; closing the last
// registration of a function deletes it. A task runs as one synchronous
// invocation through a relay process that the core supervises like any
// task. Collect deletes functions whose Run no longer exists.
//
// All AWS calls go through aws-sdk-go-v2's lambda client, configured the
// way AWS users expect (the default credential chain and region,
// AWS_ENDPOINT_URL_LAMBDA).
package lambda

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runtime/bash"
	"stoke.dev/stoke/internal/runtime/python"
)

// Defaults of Config.
const (
	DefaultNamePrefix = "stoke-"
	DefaultMemoryMB   = 512
	// DefaultTaskTimeout is the largest timeout of a task function:
	// Lambda's. A task function's timeout is the task's own (see runTask).
	DefaultTaskTimeout = 15 * time.Minute
)

// The Lambda runtimes and paths Stoke's functions use.
const (
	// ManagedPython is the Lambda runtime of a Python function: AWS's
	// managed Python, on Amazon Linux 2023, whose python3 the bootstrap's
	// Python adapter uses, so that no layer has to bring one
	// (provided.al2023 has none). The bootstrap starts through
	// AWS_LAMBDA_EXEC_WRAPPER instead of the runtime's own client.
	ManagedPython = "python3.13"
	// ExecWrapper is the wrapper a managed runtime starts with its own
	// command as arguments: the packaged bootstrap at Lambda's task root,
	// which ignores them and serves the Runtime API itself.
	ExecWrapper = "/var/task/bootstrap"
	// ImageBootstrap is where a container image holds its bootstrap;
	// Stoke makes it the image function's entrypoint.
	ImageBootstrap = "/opt/stoke/bootstrap"
	// BootstrapBinary is the name of the small bootstrap binary
	// (cmd/stoke-lambda-bootstrap) beside a stoke binary.
	BootstrapBinary = "stoke-lambda-bootstrap"
)

// PipPlatformArgs are the pip install arguments that pick packages for
// Lambda's managed Python (ManagedPython) on arch: wheels only, as pydeps
// installs anyway.
func PipPlatformArgs(arch string) []string {
	platform := map[string]string{"x86_64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}[arch]
	version := strings.TrimPrefix(ManagedPython, "python")
	return []string{"--platform", platform, "--python-version", version, "--implementation", "cp"}
}

// DefaultBootstrap is what a Runtime Server running the stoke binary exe
// packages as bootstrap when told nothing: the stoke-lambda-bootstrap
// beside exe (a fifth of its size: it leaves out the control plane, the
// CLI and the Kubernetes clients), else exe itself, which also serves as
// bootstrap under that name but deflates to about Lambda's limit.
func DefaultBootstrap(exe string) string {
	small := filepath.Join(filepath.Dir(exe), BootstrapBinary)
	if fi, err := os.Stat(small); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return small
	}
	return exe
}

// Config configures a Lambda Runtime Server.
type Config struct {
	// Runtime is the inner runtime the bootstrap runs: bash or python.
	Runtime string
	// Role is the execution role's ARN (required).
	Role string
	// Architecture is x86_64 or arm64; Bootstrap must be built for it.
	Architecture string
	MemoryMB     int32
	// NamePrefix starts every function name; the collector only looks at
	// functions with it.
	NamePrefix string
	// Bootstrap is the binary to package as bootstrap: a
	// stoke-lambda-bootstrap or a stoke, built for Architecture. Empty
	// means DefaultBootstrap of this executable, which must then match
	// Architecture.
	Bootstrap string
	// PythonDeps, with a Root, installs a python function's or task's
	// requirements.txt into its package (pip for Lambda's platform:
	// PipPlatformArgs of Architecture), through the requirements cache
	// shared by the Runtime's servers.
	PythonDeps pydeps.Config
	// Image, when set, makes the functions container-image functions of
	// this image (PackageType Image), which holds the code and a stoke
	// binary at ImageBootstrap: nothing is packaged, and a Run must carry
	// no source. Bootstrap is then not used.
	Image string
	// Relay is the stoke binary a task's relay process runs; empty means
	// this executable.
	Relay string
	// TaskTimeout is the largest timeout of a task function, and the
	// timeout of a task that comes without one.
	TaskTimeout time.Duration
	// Client overrides the SDK client (tests); nil loads the default AWS
	// configuration.
	Client *awslambda.Client
	// Observe, when set, is told how long each step of placing a function
	// took: "package", "create" (CreateFunction), "active" (waiting until
	// Active) and "ping" (the first invocation, which loads the handler);
	// for tasks, "task" (the invocation, to its answer), "agent" (from
	// the Invoke call to its agent's connection) and "agent-in-sandbox"
	// (from the sandbox's receipt of the invocation to the agent's hello,
	// as the agent measured it).
	Observe func(step string, d time.Duration)
	// StateDir holds the relay socket of tasks (a private directory).
	StateDir string
	// AgentListen is where exec's reverse agents connect (default
	// 127.0.0.1:0); anything but a loopback address needs TLS, AgentCert
	// and AgentKey (PEM files).
	AgentListen         string
	AgentCert, AgentKey string
	// AgentURL is what the bootstraps dial: wss://, or ws:// to a
	// loopback address (default: AgentListen's address, which only a
	// sandbox on this machine reaches).
	AgentURL string
	// AgentWait bounds how long an exec waits for its Run's agent
	// (default agent.DefaultWait).
	AgentWait time.Duration
	// SandboxIdle is how long a function's exec sandbox stays with no
	// session open (default DefaultSandboxIdle).
	SandboxIdle time.Duration
	// WriteBackBytes bounds what a task of a shared workspace writes back
	// (default bounds.ArtifactBytes; tests set less).
	WriteBackBytes int64
	// WroteBack, when set, hears of every write-back that succeeded
	// (tests, benchmarks).
	WroteBack func(WriteBack)
	// AgentMetrics, when set, receives the endpoint's metrics.
	AgentMetrics *agent.Metrics
	Logger       *slog.Logger
}

// closeGrace is how long Close waits for the invocations of cancelled
// tasks and released sandboxes to end before it gives them up.
const closeGrace = 5 * time.Second

// Server is the Lambda adapter with its AWS client.
type Server struct {
	cfg Config
	log *slog.Logger
	c   *awslambda.Client // the control plane, with the SDK's retries
	inv *awslambda.Client // invocations (invokeClient)
	// warm makes the invocations, with inv.
	warm  *warm
	inner runtime.Adapter // validates handlers
	boot  *bootstrapEntry
	deps  *pydeps.Cache // python requirements into packages; nil: none
	relay *relay
	// wholeWriteBack copies a write-back task's whole directory, as
	// before the bootstrap listed its changes: the benchmarks' peer
	// (export_test.go), never set otherwise.
	wholeWriteBack atomic.Bool
	// agents is the reverse agents' endpoint; agentHTTP serves it.
	agents    *agent.Endpoint
	agentHTTP *http.Server
	bg        sync.WaitGroup // exec sandboxes' invocations, task kills
	// bgCtx bounds what bg runs; Close cancels it after a grace.
	bgCtx    context.Context
	bgCancel context.CancelFunc

	mu sync.Mutex
	// taskGrants are the grants of the tasks' invocations by taskKey;
	// sandboxes those of the functions' exec sandboxes; instances the
	// loaded registration of each function Run.
	taskGrants map[string]*agent.Grant
	sandboxes  map[string]*agent.Grant
	instances  map[string]*instance
	closing    bool
	refs       map[string]int // registrations and tasks per function name
	// deleting holds, per function name, a channel closed once the
	// deletion that its last user's release started has ended: a new user
	// of that name waits for it, or the deletion would take the function
	// it has just found Active.
	deleting map[string]chan struct{}
}

// NewClient returns a Lambda client from the default AWS configuration:
// credential chain, region, and endpoint (AWS_ENDPOINT_URL_LAMBDA).
func NewClient(ctx context.Context) (*awslambda.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("aws configuration: no region: set AWS_REGION or a profile's region")
	}
	return awslambda.NewFromConfig(cfg), nil
}

// New checks cfg and returns a Server; Close stops its relay.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Role == "" {
		return nil, errors.New("lambda: an execution role ARN is required (--lambda-role)")
	}
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = DefaultNamePrefix
	}
	if len(cfg.NamePrefix) > 32 {
		return nil, fmt.Errorf("lambda: name prefix %q is longer than 32 characters", cfg.NamePrefix)
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	if cfg.WriteBackBytes <= 0 {
		cfg.WriteBackBytes = bounds.ArtifactBytes
	}
	if cfg.SandboxIdle <= 0 {
		cfg.SandboxIdle = DefaultSandboxIdle
	}
	if cfg.TaskTimeout <= 0 || cfg.TaskTimeout > DefaultTaskTimeout {
		cfg.TaskTimeout = DefaultTaskTimeout
	}
	goarch := map[string]string{"amd64": "x86_64", "arm64": "arm64"}[goruntime.GOARCH]
	if cfg.Architecture == "" {
		cfg.Architecture = goarch
	}
	if cfg.Architecture != "x86_64" && cfg.Architecture != "arm64" {
		return nil, fmt.Errorf("lambda: architecture %q: want x86_64 or arm64", cfg.Architecture)
	}
	if cfg.Bootstrap == "" && cfg.Image == "" {
		if cfg.Architecture != goarch {
			return nil, fmt.Errorf("lambda: this stoke is built for %s; give --lambda-bootstrap, a stoke built for %s", goruntime.GOARCH, cfg.Architecture)
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("lambda: %w", err)
		}
		cfg.Bootstrap = DefaultBootstrap(exe)
		if cfg.Bootstrap == exe {
			cfg.Logger.Warn("no "+BootstrapBinary+" beside this stoke: packaging the whole stoke binary as bootstrap, which may pass Lambda's package limit",
				"want", filepath.Join(filepath.Dir(exe), BootstrapBinary))
		}
	}
	if cfg.Relay == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("lambda: %w", err)
		}
		cfg.Relay = exe
	}
	var inner runtime.Adapter
	switch cfg.Runtime {
	case "bash":
		inner = bash.New(bash.Config{})
	case "python":
		inner = python.New(python.Config{})
	default:
		return nil, fmt.Errorf("lambda: inner runtime %q: want bash or python", cfg.Runtime)
	}
	c := cfg.Client
	if c == nil {
		var err error
		if c, err = NewClient(ctx); err != nil {
			return nil, err
		}
	}
	var deps *pydeps.Cache
	if cfg.PythonDeps.Root != "" && cfg.Runtime == "python" && cfg.Image == "" {
		dc := cfg.PythonDeps
		dc.PipArgs = append(PipPlatformArgs(cfg.Architecture), dc.PipArgs...)
		var err error
		if deps, err = pydeps.New(dc); err != nil {
			return nil, fmt.Errorf("lambda: %w", err)
		}
	}
	inv := invokeClient(c)
	agents, agentHTTP, err := startAgentEndpoint(&cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, c: c, inv: inv, warm: newWarm(inv), inner: inner, deps: deps,
		boot: bootstrapFor(cfg.Bootstrap), refs: map[string]int{}, deleting: map[string]chan struct{}{},
		agents: agents, agentHTTP: agentHTTP, taskGrants: map[string]*agent.Grant{}, sandboxes: map[string]*agent.Grant{},
		instances: map[string]*instance{}}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	r, err := newRelay(s, cfg.StateDir)
	if err != nil {
		s.warm.close()
		_ = agentHTTP.Close()
		agents.Close()
		return nil, err
	}
	s.relay = r
	if cfg.Image == "" {
		// Deflate the bootstrap now rather than in the first registration.
		go func() { _ = s.boot.load() }()
	}
	return s, nil
}

// Close stops accepting task relays and waits for the ones in flight,
// releases the exec sandboxes and closes the agents' endpoint.
func (s *Server) Close() error {
	err := s.relay.close()
	s.mu.Lock()
	s.closing = true
	var uids []string
	for uid := range s.instances {
		uids = append(uids, uid)
	}
	s.mu.Unlock()
	for _, uid := range uids {
		s.closeSandboxes(uid)
	}
	// The tasks' agents were told to kill them (the relays' calls
	// ended); invocations that do not end within the grace are given up.
	done := make(chan struct{})
	go func() {
		s.bg.Wait()
		close(done)
	}()
	t := time.NewTimer(closeGrace)
	select {
	case <-done:
	case <-t.C:
		s.bgCancel()
		<-done
	}
	t.Stop()
	s.bgCancel()
	_ = s.agentHTTP.Close()
	s.agents.Close()
	s.warm.close()
	return err
}

// Name is "lambda".
func (s *Server) Name() string { return "lambda" }

// ValidateHandler checks the inner runtime's handler syntax.
func (s *Server) ValidateHandler(h string) error { return s.inner.ValidateHandler(h) }

// Load places the function on Lambda: package, create or find, wait until
// Active, and ping it so that a handler that cannot load fails here, with
// its init error.
func (s *Server) Load(ctx context.Context, fs runtime.FunctionSpec) (runtime.Instance, error) {
	start := time.Now()
	p, err := s.build(ctx, fs.WorkingDir, s.spec(fs.Handler, userEnv(fs.Env, fs.WorkingDir), int32(bounds.MaxInvokeTimeout/time.Second)))
	s.observe("package", start)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", fs.RunUID, err)
	}
	if err := s.acquire(ctx, p, fs.RunUID); err != nil {
		return nil, fmt.Errorf("run %s: %w", fs.RunUID, err)
	}
	inst := &instance{s: s, name: p.name, fn: aws.String(p.name), uid: fs.RunUID, done: make(chan struct{})}
	start = time.Now()
	out, err := s.ping(ctx, p.name)
	s.observe("ping", start)
	if err != nil {
		err = awsError("Invoke", err)
	} else {
		_, err = decode(out)
	}
	if err != nil {
		_ = inst.Close()
		var fe *errdefs.FunctionError
		if errors.As(err, &fe) {
			return nil, fmt.Errorf("function %s: %s", p.name, fe.Error())
		}
		return nil, fmt.Errorf("function %s: %w", p.name, err)
	}
	fs.Logger.Info("lambda function ready", "function", p.name)
	s.mu.Lock()
	s.instances[fs.RunUID] = inst
	s.mu.Unlock()
	return inst, nil
}

// ping proves the handler loads. A registration is not a user's
// invocation: past the concurrency limit it waits and tries again, within
// ctx (the core's init timeout).
func (s *Server) ping(ctx context.Context, name string) (*awslambda.InvokeOutput, error) {
	delay := 50 * time.Millisecond
	for {
		out, err := s.invoke(ctx, aws.String(name), pingEvent)
		var tooMany *types.TooManyRequestsException
		if !errors.As(err, &tooMany) {
			return out, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// acquire creates the function of p, or finds the one that exists, waits
// until it is Active and counts one more user of it. A deletion of the
// function under way (its last user released it) is waited for first.
func (s *Server) acquire(ctx context.Context, p *pkg, uid string) error {
	s.mu.Lock()
	for {
		done, ok := s.deleting[p.name]
		if !ok {
			break
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("function %s: waiting for its deletion to end: %w", p.name, ctx.Err())
		}
		s.mu.Lock()
	}
	s.refs[p.name]++
	s.mu.Unlock()
	if err := s.ensure(ctx, p, uid); err != nil {
		s.release(p.name)
		return err
	}
	return nil
}

func (s *Server) ensure(ctx context.Context, p *pkg, uid string) error {
	start := time.Now()
	_, err := s.c.CreateFunction(ctx, createInput(p, s.cfg.Role, uid))
	s.observe("create", start)
	var conflict *types.ResourceConflictException
	switch {
	case err == nil:
		s.log.Info("lambda function created", "function", p.name, "run_uid", uid, "bytes", len(p.zip))
	case errors.As(err, &conflict):
		// An identical registration made it: the name is its digest.
	default:
		return awsError("CreateFunction", err)
	}
	w := awslambda.NewFunctionActiveV2Waiter(s.c, func(o *awslambda.FunctionActiveV2WaiterOptions) {
		o.MinDelay, o.MaxDelay = 25*time.Millisecond, time.Second
	})
	wait := bounds.InitTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	start = time.Now()
	out, err := w.WaitForOutput(ctx, &awslambda.GetFunctionInput{FunctionName: aws.String(p.name)}, wait)
	s.observe("active", start)
	if err != nil {
		if out != nil && out.Configuration != nil && out.Configuration.State == types.StateFailed {
			return fmt.Errorf("function %s failed: %s", p.name, aws.ToString(out.Configuration.StateReason))
		}
		return awsError("waiting for the function to be Active", err)
	}
	if d := out.Tags[TagDigest]; d != "" && d != p.digest {
		return fmt.Errorf("function %s exists with another digest %s: delete it or use another name prefix", p.name, d)
	}
	return nil
}

// createInput is p's CreateFunction: a zip on the Lambda runtime of its
// spec, or the image with Stoke's bootstrap as its entrypoint.
func createInput(p *pkg, role, uid string) *awslambda.CreateFunctionInput {
	in := &awslambda.CreateFunctionInput{
		FunctionName:  aws.String(p.name),
		Role:          aws.String(role),
		Timeout:       aws.Int32(p.spec.TimeoutSecs),
		MemorySize:    aws.Int32(p.spec.MemoryMB),
		Architectures: []types.Architecture{types.Architecture(p.spec.Architecture)},
		Environment:   &types.Environment{Variables: p.env},
		Description:   aws.String("Stoke " + p.spec.Runtime + " Run"),
		Tags:          map[string]string{TagRunUID: uid, TagDigest: p.digest},
	}
	if p.spec.Image != "" {
		// The handler is in the environment (payload.EnvHandler): Lambda
		// takes none for an image.
		in.PackageType = types.PackageTypeImage
		in.Code = &types.FunctionCode{ImageUri: aws.String(p.spec.Image)}
		in.ImageConfig = &types.ImageConfig{EntryPoint: []string{ImageBootstrap}}
		return in
	}
	in.PackageType = types.PackageTypeZip
	in.Runtime = types.Runtime(p.spec.LambdaRuntime)
	in.Handler = aws.String(handlerOrNone(p.spec.Handler))
	in.Code = &types.FunctionCode{ZipFile: p.zip}
	return in
}

// lambdaRuntime is the Lambda runtime of a zip function of the inner
// runtime: Python on AWS's managed Python (which has python3), bash on
// the OS-only runtime.
func lambdaRuntime(inner string) string {
	if inner == "python" {
		return ManagedPython
	}
	return string(types.RuntimeProvidedal2023)
}

func (s *Server) observe(step string, start time.Time) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(step, time.Since(start))
	}
}

// handlerOrNone: Lambda wants a handler; a task function has none.
func handlerOrNone(h string) string {
	if h == "" {
		return payload.TaskHandler
	}
	return h
}

// release counts one user less of a function and deletes it after the
// last.
func (s *Server) release(name string) {
	s.mu.Lock()
	s.refs[name]--
	last := s.refs[name] <= 0
	var done chan struct{}
	if last {
		delete(s.refs, name)
		done = make(chan struct{})
		s.deleting[name] = done
	}
	s.mu.Unlock()
	if !last {
		return
	}
	defer func() {
		s.mu.Lock()
		delete(s.deleting, name)
		s.mu.Unlock()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.c.DeleteFunction(ctx, &awslambda.DeleteFunctionInput{FunctionName: aws.String(name)})
	var nf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &nf) {
		s.log.Warn("deleting a lambda function failed; the collector will retry", "function", name, "error", err)
		return
	}
	s.log.Info("lambda function deleted", "function", name)
}

var pingEvent, _ = json.Marshal(payload.Request{Kind: payload.KindPing})

// invokeClient is c configured for synchronous invocations, the way AWS
// recommends for latency: one client for every call, no retries (a
// retried invocation may run twice: the error goes to the caller, whose
// retry policy decides), and idle connections kept for as many calls at
// once as the Runtime Server makes on warm goroutines, so that a burst
// does not open (and on AWS, handshake) new ones.
func invokeClient(c *awslambda.Client) *awslambda.Client {
	return awslambda.New(c.Options(), func(o *awslambda.Options) {
		o.Retryer, o.RetryMaxAttempts = aws.NopRetryer{}, 0
		if b, ok := o.HTTPClient.(*awshttp.BuildableClient); ok {
			o.HTTPClient = b.WithTransportOptions(func(t *http.Transport) {
				t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, maxWarm)
			})
		}
	})
}

// invoke makes one synchronous invocation of event (a payload.Request)
// and returns its raw answer, or the SDK's error (see awsError).
func (s *Server) invoke(ctx context.Context, fn *string, event []byte) (*awslambda.InvokeOutput, error) {
	return s.warm.invoke(ctx, &awslambda.InvokeInput{FunctionName: fn, Payload: event})
}

// decode maps an invocation's answer: a function error becomes the
// contract's error, anything else the bootstrap's Response.
func decode(out *awslambda.InvokeOutput) (payload.Response, error) {
	var resp payload.Response
	if out.FunctionError != nil {
		var pe payload.Error
		if err := json.Unmarshal(out.Payload, &pe); err != nil || pe.Type == "" {
			return resp, &errdefs.FunctionError{Type: "Runtime.Unknown", Message: bounds.Truncate(string(out.Payload), bounds.Message)}
		}
		msg := bounds.Truncate(pe.Message, bounds.Message)
		switch pe.Type {
		case "Sandbox.Timedout", payload.ErrorTimeout:
			return resp, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "lambda: %s", msg)
		case payload.ErrorNotReady:
			return resp, errdefs.Errorf(errdefs.ErrFailedPrecondition, "lambda: %s", msg)
		case payload.ErrorBadRequest:
			return resp, errdefs.Errorf(errdefs.ErrInternal, "lambda: the bootstrap refused the request: %s", msg)
		}
		return resp, &errdefs.FunctionError{Type: pe.Type, Message: msg,
			StackTrace: bounds.Truncate(strings.Join(pe.StackTrace, "\n"), bounds.StackTrace)}
	}
	if err := json.Unmarshal(out.Payload, &resp); err != nil {
		return resp, errdefs.Errorf(errdefs.ErrInternal, "lambda: the answer is not a Stoke response: %v", err)
	}
	return resp, nil
}

// awsError maps an AWS API error to the contract's categories; the AWS
// message stays in the text.
func awsError(op string, err error) error {
	var (
		tooMany  *types.TooManyRequestsException
		notFound *types.ResourceNotFoundException
		tooLarge *types.RequestTooLargeException
		conflict *types.ResourceConflictException
		api      smithy.APIError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &tooMany):
		return errdefs.Errorf(errdefs.ErrResourceExhausted, "lambda %s: %s", op, tooMany.ErrorMessage())
	case errors.As(err, &notFound):
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "lambda %s: the function is gone: %s", op, notFound.ErrorMessage())
	case errors.As(err, &tooLarge):
		return errdefs.Errorf(errdefs.ErrTooLarge, "lambda %s: %s", op, tooLarge.ErrorMessage())
	case errors.As(err, &conflict):
		return errdefs.Errorf(errdefs.ErrUnavailable, "lambda %s: %s", op, conflict.ErrorMessage())
	case errors.As(err, &api):
		switch api.ErrorCode() {
		case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
			"ExpiredTokenException", "AccessDenied", "InvalidClientTokenId":
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "lambda %s: AWS refused the credentials: %s: %s", op, api.ErrorCode(), api.ErrorMessage())
		}
		return errdefs.Errorf(errdefs.ErrUnavailable, "lambda %s: %s: %s", op, api.ErrorCode(), api.ErrorMessage())
	}
	return errdefs.Errorf(errdefs.ErrUnavailable, "lambda %s: %v", op, err)
}

// userEnv is the registration's own env: the core's environment less the
// base it adds for local processes (PATH, LANG, HOME, TMPDIR), which has
// no meaning inside Lambda.
func userEnv(env []string, workingDir string) map[string]string {
	base := runtime.BaseEnv(workingDir, "")
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if b, ok := base[k]; ok && (b == v || k == "TMPDIR") {
			continue
		}
		m[k] = v
	}
	return m
}

// instance is one registration's hold on a function.
type instance struct {
	s         *Server
	name, uid string
	fn        *string // name, as the SDK takes it
	done      chan struct{}
	doneOnce  sync.Once
	closeOnce sync.Once
}

// Invoke makes one synchronous invocation. A function that vanished makes
// the instance done, so that the core loads it again (recreating the
// function) without the Run leaving Ready.
func (i *instance) Invoke(ctx context.Context, inv runtime.Invocation) (runtime.Result, error) {
	var timeout int64
	if !inv.Deadline.IsZero() {
		timeout = max(1, time.Until(inv.Deadline).Milliseconds())
	}
	out, err := i.s.invoke(ctx, i.fn, payload.InvokeEvent(inv.ID, timeout, inv.Input))
	if err != nil {
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			i.doneOnce.Do(func() { close(i.done) })
		}
		return runtime.Result{}, fmt.Errorf("invocation %s: %w", inv.ID, awsError("Invoke", err))
	}
	resp, err := decode(out)
	if err != nil {
		return runtime.Result{}, err
	}
	return runtime.Result{Output: resp.Output, Outputs: resp.Outputs}, nil
}

func (i *instance) Done() <-chan struct{} { return i.done }

// Close gives up this registration's hold; the last one deletes the
// function.
func (i *instance) Close() error {
	i.closeOnce.Do(func() {
		i.s.mu.Lock()
		if i.s.instances[i.uid] == i {
			delete(i.s.instances, i.uid)
		}
		i.s.mu.Unlock()
		i.s.closeSandboxes(i.uid)
		i.s.release(i.name)
	})
	return nil
}
