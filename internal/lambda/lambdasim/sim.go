// Package lambdasim is a test-only AWS Lambda control plane: an HTTP
// server speaking the Lambda REST API (2015-03-31) that aws-sdk-go-v2's
// lambda client uses for CreateFunction with a zip, GetFunction,
// GetFunctionConfiguration, Invoke, DeleteFunction, ListFunctions and the
// tag calls, closely enough that the real SDK, pointed at it with
// BaseEndpoint and static credentials, cannot tell the difference on those
// calls. A function is Pending for a moment after it is created, then
// Active. An invocation runs in a sandbox: the real AWS Lambda Runtime
// Interface Emulator started with the package's bootstrap, the zip
// unpacked once per function and shared by its sandboxes (as /var/task). A sandbox serves one
// invocation at a time, as on Lambda; concurrent invocations get more
// sandboxes, which stay warm and are reused. The function's timeout kills
// the sandbox; a caller that goes away does not end its invocation.
//
// A function's runtime starts as on Lambda: provided.al2023 runs the
// package's bootstrap; a managed python3.x runtime runs this machine's
// python3 with Lambda's runtime script, handed to AWS_LAMBDA_EXEC_WRAPPER
// as its arguments when the function sets one (it has no runtime client of
// its own, so without a wrapper the init fails); an Image function runs its
// ImageConfig.EntryPoint (or Config.Images' entrypoint) inside the
// directory Config.Images maps its URI to, whose var/task is the code.
//
// What it does not model: a managed runtime's own client and version (the
// machine's python3 stands for it); an image's layers, pull, metadata and
// isolation (its programs run on this machine, without a chroot); IAM (the role is only checked to look like an
// ARN; the signature only to name the configured access key), versions,
// aliases and qualifiers, asynchronous invocation, layers, S3 code,
// UpdateFunction*, memory limits and the /tmp size, freezing a sandbox
// between invocations (its processes keep running), reserved concurrency
// (one account-wide limit), and the Failed state (a package is Active
// unless its zip is unreadable). The RIE answers a handler error with 200
// like a success, so the simulator recognises one by its body: a JSON
// object with errorType and errorMessage and nothing else but stackTrace.
package lambdasim

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/internal/bounds"
)

// Account and region of every ARN the simulator makes.
const (
	Account = "123456789012"
	Region  = "us-east-1"
)

// Config configures a Simulator.
type Config struct {
	// RIE is the aws-lambda-rie binary (testdeps.Path("aws-lambda-rie")).
	RIE string
	// Dir holds the sandboxes; it should be private to the test.
	Dir string
	// AccessKeyID is the only access key the simulator accepts.
	AccessKeyID string
	// Concurrency is the account's concurrent-invocation limit; past it
	// Invoke answers TooManyRequestsException. Zero means 1000.
	Concurrency int
	// Pending is how long a new function stays Pending. Zero means 50 ms.
	Pending time.Duration
	// BeforeDelete, when set, is called with the function's name when a
	// DeleteFunction request comes, before the function is looked up: a
	// test holds a deletion in flight with it.
	BeforeDelete func(name string)
	// BeforeCreate and BeforeInvoke, when set, are called with the
	// request's context and the function's name when a CreateFunction or
	// Invoke request comes, before the simulator acts on it: a test holds
	// the call there (an API that hangs: the context ends when the caller
	// goes away), or refuses it by returning a Refusal.
	BeforeCreate func(ctx context.Context, name string) *Refusal
	BeforeInvoke func(ctx context.Context, name string) *Refusal
	// Images are the container images a function may be created from
	// (PackageType Image), by ImageUri, as the Kubernetes test node agent
	// maps images: each is a directory on this machine that stands for
	// the image's file system. An unknown ImageUri is refused.
	Images map[string]Image
	Logger *slog.Logger
}

// Image is a container image as the simulator runs it.
type Image struct {
	// Root stands for the image's root file system: the paths of the
	// entrypoint and of LAMBDA_TASK_ROOT (/var/task) are taken inside it.
	// The programs themselves run on this machine, not in the image (no
	// chroot): an absolute path they use is the machine's, and the image's
	// python3 is the machine's.
	Root string
	// Entrypoint is the image's ENTRYPOINT, its paths inside Root;
	// CreateFunction's ImageConfig.EntryPoint replaces it.
	Entrypoint []string
}

// TaskRoot is LAMBDA_TASK_ROOT, where Lambda's code is.
const TaskRoot = "/var/task"

// managedRuntimeCommand is how a managed Python runtime starts (its own
// runtime client, which the simulator does not have): the wrapper of
// AWS_LAMBDA_EXEC_WRAPPER gets it as its arguments; without a wrapper the
// sandbox fails its init, as a python3.x function would on Lambda whose
// handler module the simulator cannot load.
const managedRuntimeScript = "/var/runtime/bootstrap.py"

// Refusal is an AWS error a hook answers a call with: the HTTP status and
// the error type (e.g. 403 AccessDeniedException, 500 ServiceException,
// which the SDK's control-plane client retries).
type Refusal struct {
	Status  int
	Type    string
	Message string
}

// refused answers r when there is one.
func refused(w http.ResponseWriter, r *Refusal) bool {
	if r == nil {
		return false
	}
	writeError(w, r.Status, r.Type, r.Message)
	return true
}

// Simulator is the Lambda control plane. Close stops every sandbox.
type Simulator struct {
	cfg Config
	log *slog.Logger
	srv *http.Server
	lis net.Listener

	mu       sync.Mutex
	fns      map[string]*function
	inflight int
	closed   bool
	creates  int
	ended    []Ended
	endedCh  chan struct{} // closed and replaced when an invocation ends
	fnsCh    chan struct{} // closed and replaced when a function is created or deleted
	boxes    []*sandbox    // the latest sandboxes, for SandboxLogs
	wg       sync.WaitGroup
}

// Ended is how one invocation ended in its sandbox.
type Ended struct {
	Function string
	// ErrorType is the errorType of a function error: the simulator's own
	// (Sandbox.Timedout when the function's timeout killed the sandbox)
	// or the function's; "" for an answer.
	ErrorType string
	// Timeout is the function's configured timeout.
	Timeout time.Duration
}

// function is one Lambda function.
type function struct {
	conf configuration
	tags map[string]string
	zip  []byte // a Zip function's package
	// imageURI is an Image function's image (Config.Images).
	imageURI string
	created  time.Time
	idle     []*sandbox // warm sandboxes waiting for an invocation
	all      map[*sandbox]struct{}
	deleted  bool

	unpackOnce sync.Once
	code       string // the unpacked package, shared by the sandboxes
	unpackErr  error
}

// configuration is the FunctionConfiguration document.
type configuration struct {
	FunctionName     string       `json:"FunctionName"`
	FunctionArn      string       `json:"FunctionArn"`
	Runtime          string       `json:"Runtime"`
	Role             string       `json:"Role"`
	Handler          string       `json:"Handler,omitempty"`
	CodeSize         int64        `json:"CodeSize"`
	CodeSha256       string       `json:"CodeSha256"`
	Description      string       `json:"Description,omitempty"`
	Timeout          int32        `json:"Timeout"`
	MemorySize       int32        `json:"MemorySize"`
	LastModified     string       `json:"LastModified"`
	Version          string       `json:"Version"`
	Environment      *environment `json:"Environment,omitempty"`
	ImageConfig      *imageConfig `json:"ImageConfigResponse,omitempty"`
	State            string       `json:"State"`
	StateReason      string       `json:"StateReason,omitempty"`
	StateReasonCode  string       `json:"StateReasonCode,omitempty"`
	LastUpdateStatus string       `json:"LastUpdateStatus"`
	PackageType      string       `json:"PackageType"`
	Architectures    []string     `json:"Architectures"`
}

type environment struct {
	Variables map[string]string `json:"Variables,omitempty"`
}

type imageConfig struct {
	ImageConfig struct {
		EntryPoint       []string `json:"EntryPoint,omitempty"`
		Command          []string `json:"Command,omitempty"`
		WorkingDirectory string   `json:"WorkingDirectory,omitempty"`
	} `json:"ImageConfig"`
}

// New starts a simulator on a loopback port.
func New(cfg Config) (*Simulator, error) {
	if cfg.RIE == "" || cfg.Dir == "" || cfg.AccessKeyID == "" {
		return nil, fmt.Errorf("lambdasim: RIE, Dir and AccessKeyID are required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1000
	}
	if cfg.Pending <= 0 {
		cfg.Pending = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lambdasim: %w", err)
	}
	s := &Simulator{cfg: cfg, log: cfg.Logger, lis: lis, fns: map[string]*function{}, endedCh: make(chan struct{}), fnsCh: make(chan struct{})}
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(lis)
	}()
	return s, nil
}

// URL is the endpoint to give the SDK as BaseEndpoint.
func (s *Simulator) URL() string { return "http://" + s.lis.Addr().String() }

// CreateCalls counts the CreateFunction calls that created a function.
func (s *Simulator) CreateCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates
}

// Created is what a function was created with, for a test to check.
type Created struct {
	Runtime, Handler, PackageType, ImageURI string
	// EntryPoint is the ImageConfig's.
	EntryPoint []string
	Env        map[string]string
}

// Created returns what function name was created with.
func (s *Simulator) Created(name string) (Created, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn := s.fns[name]
	if fn == nil {
		return Created{}, false
	}
	c := Created{Runtime: fn.conf.Runtime, Handler: fn.conf.Handler, PackageType: fn.conf.PackageType, ImageURI: fn.imageURI}
	if ic := fn.conf.ImageConfig; ic != nil {
		c.EntryPoint = slices.Clone(ic.ImageConfig.EntryPoint)
	}
	if e := fn.conf.Environment; e != nil {
		c.Env = copyTags(e.Variables)
	}
	return c, true
}

// Functions lists the names of the functions that exist, sorted.
func (s *Simulator) Functions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for n := range s.fns {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// AwaitFunctions waits until ok holds of the names of the functions that
// exist, sorted, and returns them: a function is deleted by its last
// user's release, which may come a moment after the invocation that
// preceded it has answered.
func (s *Simulator) AwaitFunctions(ctx context.Context, ok func([]string) bool) ([]string, error) {
	for {
		s.mu.Lock()
		ch := s.fnsCh
		s.mu.Unlock()
		names := s.Functions()
		if ok(names) {
			return names, nil
		}
		select {
		case <-ctx.Done():
			return names, fmt.Errorf("lambdasim: waiting for the functions to change from %v: %w", names, ctx.Err())
		case <-ch:
		}
	}
}

func (s *Simulator) fnsChangedLocked() {
	close(s.fnsCh)
	s.fnsCh = make(chan struct{})
}

// AwaitEnded waits until n invocations have ended in their sandboxes,
// whether or not their callers waited for them, and returns how the first
// n ended.
func (s *Simulator) AwaitEnded(ctx context.Context, n int) ([]Ended, error) {
	for {
		s.mu.Lock()
		if len(s.ended) >= n {
			e := slices.Clone(s.ended[:n])
			s.mu.Unlock()
			return e, nil
		}
		ch := s.endedCh
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lambdasim: waiting for %d invocations to end: %w", n, ctx.Err())
		case <-ch:
		}
	}
}

// SetConcurrency changes the account's concurrent-invocation limit.
func (s *Simulator) SetConcurrency(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Concurrency = n
}

// Sandboxes counts a function's sandboxes, busy or warm.
func (s *Simulator) Sandboxes(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fn := s.fns[name]; fn != nil {
		return len(fn.all)
	}
	return 0
}

// Close stops the server and kills every sandbox.
func (s *Simulator) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	s.mu.Lock()
	s.closed = true
	var boxes []*sandbox
	for _, fn := range s.fns {
		for sb := range fn.all {
			boxes = append(boxes, sb)
		}
	}
	s.fns = map[string]*function{}
	s.mu.Unlock()
	for _, sb := range boxes {
		sb.kill()
	}
	s.wg.Wait()
	return err
}

func (s *Simulator) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /2015-03-31/functions", s.auth(s.createFunction))
	mux.HandleFunc("GET /2015-03-31/functions", s.auth(s.listFunctions))
	mux.HandleFunc("GET /2015-03-31/functions/{name}", s.auth(s.getFunction))
	mux.HandleFunc("GET /2015-03-31/functions/{name}/configuration", s.auth(s.getFunctionConfiguration))
	mux.HandleFunc("DELETE /2015-03-31/functions/{name}", s.auth(s.deleteFunction))
	mux.HandleFunc("POST /2015-03-31/functions/{name}/invocations", s.auth(s.invoke))
	mux.HandleFunc("GET /2017-03-31/tags/{arn...}", s.auth(s.listTags))
	mux.HandleFunc("POST /2017-03-31/tags/{arn...}", s.auth(s.tagResource))
	mux.HandleFunc("DELETE /2017-03-31/tags/{arn...}", s.auth(s.untagResource))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "UnknownOperationException", "unknown operation "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// auth accepts requests signed (SigV4) with the configured access key.
func (s *Simulator) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a := r.Header.Get("Authorization")
		if !strings.HasPrefix(a, "AWS4-HMAC-SHA256 Credential="+s.cfg.AccessKeyID+"/") {
			writeError(w, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid.")
			return
		}
		h(w, r)
	}
}

// writeError answers in the REST-JSON error shape the SDK decodes.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("X-Amzn-ErrorType", typ)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"Type": "User", "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func arn(name string) string {
	return "arn:aws:lambda:" + Region + ":" + Account + ":function:" + name
}

// nameOf accepts a function name or its ARN.
func nameOf(s string) string {
	if i := strings.LastIndex(s, ":function:"); i >= 0 {
		s = s[i+len(":function:"):]
	}
	return s
}

type createRequest struct {
	FunctionName  string            `json:"FunctionName"`
	Runtime       string            `json:"Runtime"`
	Role          string            `json:"Role"`
	Handler       string            `json:"Handler"`
	Description   string            `json:"Description"`
	Timeout       int32             `json:"Timeout"`
	MemorySize    int32             `json:"MemorySize"`
	Environment   *environment      `json:"Environment"`
	Tags          map[string]string `json:"Tags"`
	Architectures []string          `json:"Architectures"`
	PackageType   string            `json:"PackageType"`
	ImageConfig   *struct {
		EntryPoint       []string `json:"EntryPoint"`
		Command          []string `json:"Command"`
		WorkingDirectory string   `json:"WorkingDirectory"`
	} `json:"ImageConfig"`
	Code struct {
		ZipFile  []byte `json:"ZipFile"`
		S3Bucket string `json:"S3Bucket"`
		ImageURI string `json:"ImageUri"`
	} `json:"Code"`
}

// managedPython is a managed Python runtime's name (python3.N), which the
// simulator runs with this machine's python3.
func managedPython(runtime string) bool {
	return strings.HasPrefix(runtime, "python3.")
}

func (s *Simulator) createFunction(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	// A 50 MiB zip arrives base64-encoded in the JSON body.
	body, err := io.ReadAll(io.LimitReader(r.Body, 4*bounds.LambdaZip/3+1<<20))
	if err == nil {
		err = decodeCreate(body, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "cannot read the request: "+err.Error())
		return
	}
	if s.cfg.BeforeCreate != nil && refused(w, s.cfg.BeforeCreate(r.Context(), req.FunctionName)) {
		return
	}
	image := req.PackageType == "Image"
	switch {
	case req.FunctionName == "" || len(req.FunctionName) > 64:
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "FunctionName must have 1 to 64 characters")
		return
	case !strings.HasPrefix(req.Role, "arn:aws:iam::"):
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "The role defined for the function cannot be assumed by Lambda.")
		return
	case req.PackageType != "" && req.PackageType != "Zip" && !image:
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "PackageType must be Zip or Image, not "+req.PackageType)
		return
	case image && (req.Runtime != "" || req.Handler != "" || len(req.Code.ZipFile) > 0):
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "Runtime, Handler and Code.ZipFile are not supported for functions with the Image package type")
		return
	case image && req.Code.ImageURI == "":
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "Code.ImageUri is required for the Image package type")
		return
	case image:
		if _, ok := s.cfg.Images[req.Code.ImageURI]; !ok {
			writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "Source image "+req.Code.ImageURI+" does not exist. Provide a valid source image.")
			return
		}
	case req.Runtime != "provided.al2023" && req.Runtime != "provided.al2" && !managedPython(req.Runtime):
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "The simulator runs OS-only runtimes (provided.al2023) and python3.x, not "+req.Runtime)
		return
	case len(req.Code.ZipFile) == 0:
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "Code.ZipFile is required (the simulator has no S3)")
		return
	case len(req.Code.ZipFile) > bounds.LambdaZip:
		writeError(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLargeException", "Request must be smaller than 69905067 bytes for the CreateFunction operation")
		return
	}
	if !image {
		if _, err := zip.NewReader(bytes.NewReader(req.Code.ZipFile), int64(len(req.Code.ZipFile))); err != nil {
			writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "Could not unzip uploaded file. Please check your file, then try to upload again.")
			return
		}
	}
	if req.Timeout == 0 {
		req.Timeout = 3
	}
	if req.MemorySize == 0 {
		req.MemorySize = 128
	}
	if len(req.Architectures) == 0 {
		req.Architectures = []string{"x86_64"}
	}
	sum := sha256.Sum256(req.Code.ZipFile)
	fn := &function{
		conf: configuration{
			FunctionName: req.FunctionName, FunctionArn: arn(req.FunctionName), Runtime: req.Runtime, Role: req.Role,
			Handler: req.Handler, CodeSize: int64(len(req.Code.ZipFile)), CodeSha256: base64.StdEncoding.EncodeToString(sum[:]),
			Description: req.Description, Timeout: req.Timeout, MemorySize: req.MemorySize,
			LastModified: time.Now().UTC().Format("2006-01-02T15:04:05.000+0000"), Version: "$LATEST",
			Environment: req.Environment, LastUpdateStatus: "Successful", PackageType: "Zip", Architectures: req.Architectures,
		},
		tags: req.Tags, zip: req.Code.ZipFile, created: time.Now(), all: map[*sandbox]struct{}{},
	}
	if image {
		fn.conf.PackageType, fn.imageURI = "Image", req.Code.ImageURI
		if req.ImageConfig != nil {
			fn.conf.ImageConfig = &imageConfig{}
			fn.conf.ImageConfig.ImageConfig.EntryPoint = req.ImageConfig.EntryPoint
			fn.conf.ImageConfig.ImageConfig.Command = req.ImageConfig.Command
			fn.conf.ImageConfig.ImageConfig.WorkingDirectory = req.ImageConfig.WorkingDirectory
		}
	}
	s.mu.Lock()
	if _, ok := s.fns[req.FunctionName]; ok {
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "ResourceConflictException", "Function already exist: "+req.FunctionName)
		return
	}
	s.fns[req.FunctionName] = fn
	s.creates++
	s.fnsChangedLocked()
	conf := s.confLocked(fn)
	s.mu.Unlock()
	s.log.Debug("function created", "function", req.FunctionName)
	writeJSON(w, http.StatusCreated, conf)
}

// decodeCreate decodes a CreateFunction body. The base64 zip, nearly all
// of it, is cut out and decoded apart: encoding/json's byte-by-byte scan of
// tens of megabytes is what made the tests slow under -race.
func decodeCreate(body []byte, req *createRequest) error {
	const key = `"ZipFile":"`
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return json.Unmarshal(body, req)
	}
	start := i + len(key)
	n := bytes.IndexByte(body[start:], '"')
	if n < 0 {
		return errors.New("unterminated ZipFile")
	}
	zipFile, err := base64.StdEncoding.DecodeString(string(body[start : start+n]))
	if err != nil {
		return fmt.Errorf("Code.ZipFile: %w", err)
	}
	rest := append(append(bytes.Clone(body[:start]), '"'), body[start+n+1:]...)
	if err := json.Unmarshal(rest, req); err != nil {
		return err
	}
	req.Code.ZipFile = zipFile
	return nil
}

// confLocked is fn's configuration now: Pending, then Active. s.mu is held.
func (s *Simulator) confLocked(fn *function) configuration {
	c := fn.conf
	if time.Since(fn.created) < s.cfg.Pending {
		c.State, c.StateReason, c.StateReasonCode = "Pending", "The function is being created.", "Creating"
	} else {
		c.State = "Active"
	}
	return c
}

// lookup finds a function or answers ResourceNotFoundException.
func (s *Simulator) lookup(w http.ResponseWriter, name string) (*function, configuration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn := s.fns[nameOf(name)]
	if fn == nil {
		writeError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+arn(nameOf(name)))
		return nil, configuration{}, false
	}
	return fn, s.confLocked(fn), true
}

func (s *Simulator) getFunction(w http.ResponseWriter, r *http.Request) {
	fn, conf, ok := s.lookup(w, r.PathValue("name"))
	if !ok {
		return
	}
	s.mu.Lock()
	tags := copyTags(fn.tags)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"Configuration": conf,
		"Code":          map[string]string{"RepositoryType": "S3", "Location": "https://awslambda-" + Region + "-tasks.s3.amazonaws.com/snapshots/" + Account + "/" + conf.FunctionName},
		"Tags":          tags,
	})
}

func (s *Simulator) getFunctionConfiguration(w http.ResponseWriter, r *http.Request) {
	if _, conf, ok := s.lookup(w, r.PathValue("name")); ok {
		writeJSON(w, http.StatusOK, conf)
	}
}

func (s *Simulator) listFunctions(w http.ResponseWriter, r *http.Request) {
	maxItems := 50
	if v := r.URL.Query().Get("MaxItems"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 && n <= 10000 {
			maxItems = n
		}
	}
	marker := r.URL.Query().Get("Marker")
	s.mu.Lock()
	var names []string
	for n := range s.fns {
		if n > marker {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	resp := map[string]any{}
	if len(names) > maxItems {
		names = names[:maxItems]
		resp["NextMarker"] = names[len(names)-1]
	}
	confs := make([]configuration, 0, len(names))
	for _, n := range names {
		confs = append(confs, s.confLocked(s.fns[n]))
	}
	s.mu.Unlock()
	resp["Functions"] = confs
	writeJSON(w, http.StatusOK, resp)
}

func (s *Simulator) deleteFunction(w http.ResponseWriter, r *http.Request) {
	name := nameOf(r.PathValue("name"))
	if s.cfg.BeforeDelete != nil {
		s.cfg.BeforeDelete(name)
	}
	s.mu.Lock()
	fn := s.fns[name]
	if fn == nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+arn(name))
		return
	}
	delete(s.fns, name)
	fn.deleted = true
	s.fnsChangedLocked()
	idle := fn.idle
	fn.idle = nil
	for _, sb := range idle {
		delete(fn.all, sb)
	}
	s.mu.Unlock()
	// Busy sandboxes finish their invocation and are killed on return.
	for _, sb := range idle {
		sb.kill()
	}
	s.log.Debug("function deleted", "function", name)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Simulator) listTags(w http.ResponseWriter, r *http.Request) {
	fn, _, ok := s.lookup(w, r.PathValue("arn"))
	if !ok {
		return
	}
	s.mu.Lock()
	tags := copyTags(fn.tags)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"Tags": tags})
}

func (s *Simulator) tagResource(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tags map[string]string `json:"Tags"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", err.Error())
		return
	}
	fn, _, ok := s.lookup(w, r.PathValue("arn"))
	if !ok {
		return
	}
	s.mu.Lock()
	if fn.tags == nil {
		fn.tags = map[string]string{}
	}
	for k, v := range req.Tags {
		fn.tags[k] = v
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Simulator) untagResource(w http.ResponseWriter, r *http.Request) {
	fn, _, ok := s.lookup(w, r.PathValue("arn"))
	if !ok {
		return
	}
	s.mu.Lock()
	for _, k := range r.URL.Query()["tagKeys"] {
		delete(fn.tags, k)
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func copyTags(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
