// Package runtimetest is the contract suite every Runtime Server adapter
// passes: it drives a real executor.v1 gRPC server on loopback through every
// rule of the FunctionRuntime contract and the one-shot Runtime life cycle.
// An adapter's test supplies the fixtures in its own language; the suite
// supplies the assertions.
package runtimetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runtime/server"
)

// Fixture names a function every adapter provides.
type Fixture string

// The fixtures. Inputs are JSON; "n" below is the JSON number input.
const (
	// Echo returns its input unchanged.
	Echo Fixture = "echo"
	// Sleep sleeps n milliseconds, then returns true.
	Sleep Fixture = "sleep"
	// Fail fails (raises, or exits with status 3) with a message containing "boom".
	Fail Fixture = "fail"
	// Outputs sets outputs greeting=hello and count=2, returns "ok".
	Outputs Fixture = "outputs"
	// OutputValue sets output "v" to n bytes of 'x', returns "ok".
	OutputValue Fixture = "output-value"
	// BigOutput returns a JSON string of n 'x' characters (n+2 bytes).
	BigOutput Fixture = "big-output"
	// Env returns the value of the environment variable named by its
	// input string, or "" when unset.
	Env Fixture = "env"
	// Pwd returns the current working directory as a JSON string.
	Pwd Fixture = "pwd"
	// StderrFlood writes n bytes to stderr without a newline, returns "ok".
	StderrFlood Fixture = "stderr-flood"
	// Exit makes the process running the handler exit with status 7 when
	// its input is 1 (Python: os._exit(7); Bash: exit 7 from the function's
	// shell), and otherwise behaves like Echo.
	Exit Fixture = "exit"
	// SlowInit loads until a line can be read from the FIFO named by its
	// env's STOKE_GATE (one byte, so that each load takes one), then
	// behaves like Echo: a load that lasts until the test ends it,
	// whatever the machine's load.
	SlowInit Fixture = "slow-init"
	// SyntaxError fails to load with a syntax error.
	SyntaxError Fixture = "syntax-error"
	// MissingFunction names a function its file does not define.
	MissingFunction Fixture = "missing-function"
	// MissingFile names a file that does not exist.
	MissingFile Fixture = "missing-file"
)

// Source is one fixture's program: files to write (relative path →
// content) and the handler string that names it.
type Source struct {
	Files   map[string]string
	Handler string
}

// Harness describes one adapter under test.
type Harness struct {
	// Runtime is the built-in runtime name passed to server.NewAdapter,
	// or the name of the runtime whose adapter Configure sets.
	Runtime string
	// Fixtures returns the source for a fixture.
	Fixtures func(Fixture) Source
	// Task returns an entrypoint file (relative path, content) that writes
	// "hello" to stdout, writes RESULT=done to $STOKE_OUTPUTS and exits 0;
	// and one that sleeps for a minute.
	TaskOK, TaskSleep Source
	// Configure, when set, adjusts the server's configuration, e.g. to
	// serve an adapter of its own (the lambda runtime brings its own).
	Configure func(testing.TB, *server.Config)

	// Where a server cannot keep a rule of the local Runtime Servers, the
	// field that names the rule says why, and the suite holds the server
	// to what it does instead.

	// RunsACopy: handlers run in a copy of working_dir made at
	// registration (on Lambda, the function's package), so HOME and their
	// working directory are the copy's, which must hold the
	// registration's files, rather than working_dir itself.
	RunsACopy string
}

// Server is a running Runtime Server under test.
type Server struct {
	Addr      string
	Conn      *grpc.ClientConn
	Functions pb.FunctionRuntimeClient
	Runtime   pb.RuntimeClient
	Workspace string
	h         Harness
	dirs      atomic.Int64
}

// StartServer runs a real Runtime Server for h on a loopback port until the
// test ends. configure may adjust the configuration.
func StartServer(t testing.TB, h Harness, configure func(*server.Config)) *Server {
	t.Helper()
	ws := t.TempDir()
	cfg := server.Config{
		Runtime:              h.Runtime,
		Listen:               "127.0.0.1:0",
		WorkspaceRoot:        ws,
		StateDir:             filepath.Join(t.TempDir(), "state"),
		Python:               "python3",
		DefaultInvokeTimeout: 10 * time.Second,
		MaxInvokeTimeout:     30 * time.Second,
		InitTimeout:          15 * time.Second,
		ShutdownGrace:        2 * time.Second,
		Logger:               slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if h.Configure != nil {
		h.Configure(t, &cfg)
	}
	if configure != nil {
		configure(&cfg)
	}
	addrc := make(chan net.Addr, 1)
	cfg.OnListen = func(a net.Addr) { addrc <- a }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- server.Run(ctx, cfg) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-errc:
		cancel()
		t.Fatalf("runtime server did not start: %v", err)
	}
	// As runtimed dials, but sending more than the server takes, so that
	// the suite sees the server's own limit.
	conn, err := grpc.NewClient(addr.String(), append(server.DialOptions(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(8<<20)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("runtime server exited: %v", err)
		}
	})
	return &Server{
		Addr: addr.String(), Conn: conn, Workspace: ws, h: h,
		Functions: pb.NewFunctionRuntimeClient(conn),
		Runtime:   pb.NewRuntimeClient(conn),
	}
}

// testWriter sends server logs to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// Dir writes src's files into a fresh directory of the workspace and
// returns its absolute path.
func (s *Server) Dir(t testing.TB, src Source) string {
	t.Helper()
	dir := filepath.Join(s.Workspace, "runs", "r"+strconv.FormatInt(s.dirs.Add(1), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range src.Files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// RegisterRequest builds a valid request for fixture f in a fresh directory.
func (s *Server) RegisterRequest(t testing.TB, f Fixture, uid string, attempt int32) *pb.RegisterFunctionRequest {
	t.Helper()
	src := s.h.Fixtures(f)
	dir := s.Dir(t, src)
	return &pb.RegisterFunctionRequest{
		RunUid:              uid,
		RegistrationAttempt: attempt,
		WorkingDir:          dir,
		Handler:             src.Handler,
		Env:                 map[string]string{"STOKE_FIXTURE": string(f)},
		IdleTimeoutSeconds:  300,
		RegistrationDigest:  Digest(string(f), src.Handler),
	}
}

// Register registers fixture f and waits until it is READY.
func (s *Server) Register(t testing.TB, f Fixture, uid string) *pb.FunctionRegistration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.Functions.RegisterFunction(ctx, s.RegisterRequest(t, f, uid, 1))
	if err != nil {
		t.Fatalf("register %s: %v", f, err)
	}
	if resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		st, _ := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
		t.Fatalf("register %s: state %v, fatal_error %q", f, resp.GetState(), st.GetFatalError())
	}
	return resp.GetRegistration()
}

// Invoke calls reg with a JSON input.
func (s *Server) Invoke(ctx context.Context, reg *pb.FunctionRegistration, input string, timeoutMillis int64) (*pb.InvokeFunctionResponse, error) {
	return s.Functions.InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration: reg, Input: []byte(input), ContentType: "application/json", TimeoutMillis: timeoutMillis,
	})
}

// Digest is a valid registration digest over parts.
func Digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
