package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

const (
	ready    = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY
	failed   = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED
	draining = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_DRAINING
	register = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING
)

// ServerSecretEnv must be set in the test process (the server's own
// environment) by the harness's TestMain; handlers must never see it.
const ServerSecretEnv = "STOKE_SERVER_SECRET"

// Run runs the whole contract suite against h.
func Run(t *testing.T, h Harness) {
	s := StartServer(t, h, nil)
	t.Run("RegisterValidation", func(t *testing.T) { testRegisterValidation(t, s) })
	t.Run("RegisterFencing", func(t *testing.T) { testRegisterFencing(t, s) })
	t.Run("RegisterSlowInit", func(t *testing.T) { testRegisterSlowInit(t, s) })
	t.Run("InitFailures", func(t *testing.T) { testInitFailures(t, s) })
	t.Run("Status", func(t *testing.T) { testStatus(t, s) })
	t.Run("InvokeEcho", func(t *testing.T) { testInvokeEcho(t, s) })
	t.Run("InvokeValidation", func(t *testing.T) { testInvokeValidation(t, s) })
	t.Run("InvokeBusy", func(t *testing.T) { testInvokeBusy(t, s) })
	t.Run("InvokeTimeout", func(t *testing.T) { testInvokeTimeout(t, s) })
	t.Run("FunctionError", func(t *testing.T) { testFunctionError(t, s) })
	t.Run("Outputs", func(t *testing.T) { testOutputs(t, s) })
	t.Run("OutputBound", func(t *testing.T) { testOutputBound(t, s) })
	t.Run("Env", func(t *testing.T) { testEnv(t, s) })
	t.Run("StderrFlood", func(t *testing.T) { testStderrFlood(t, s) })
	t.Run("ProcessExit", func(t *testing.T) { testProcessExit(t, s) })
	t.Run("Unregister", func(t *testing.T) { testUnregister(t, s) })
	t.Run("Task", func(t *testing.T) { testTask(t, s) })
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails unless err has code, and its message contains each of
// the substrings.
func wantCode(t testing.TB, err error, code codes.Code, substrings ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	for _, s := range substrings {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Fatalf("error %q does not mention %q", status.Convert(err).Message(), s)
		}
	}
}

// functionError checks err is a FUNCTION_ERROR and returns its errorType.
func functionError(t testing.TB, err error) (errorType string, st *status.Status) {
	t.Helper()
	st = status.Convert(err)
	if st.Code() != codes.Unknown {
		t.Fatalf("got %v, want Unknown with FUNCTION_ERROR", err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "FUNCTION_ERROR" {
			if info.GetMetadata()["invocationId"] == "" {
				t.Errorf("FUNCTION_ERROR without invocationId: %v", info)
			}
			return info.GetMetadata()["errorType"], st
		}
	}
	t.Fatalf("no FUNCTION_ERROR ErrorInfo in %v", st.Details())
	return "", nil
}

func testRegisterValidation(t *testing.T, s *Server) {
	outside := t.TempDir()
	link := filepath.Join(s.Workspace, "escape")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(s.Workspace, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bigEnv := map[string]string{}
	for i := 0; i <= bounds.EnvEntries; i++ {
		bigEnv[fmt.Sprintf("K%d", i)] = "v"
	}
	tests := []struct {
		name  string
		edit  func(*pb.RegisterFunctionRequest)
		field string
	}{
		{"empty run_uid", func(r *pb.RegisterFunctionRequest) { r.RunUid = "" }, "run_uid"},
		{"long run_uid", func(r *pb.RegisterFunctionRequest) { r.RunUid = strings.Repeat("u", bounds.RunUID+1) }, "run_uid"},
		{"attempt zero", func(r *pb.RegisterFunctionRequest) { r.RegistrationAttempt = 0 }, "registration_attempt"},
		{"attempt negative", func(r *pb.RegisterFunctionRequest) { r.RegistrationAttempt = -1 }, "registration_attempt"},
		{"relative working_dir", func(r *pb.RegisterFunctionRequest) { r.WorkingDir = "runs/x" }, "working_dir"},
		{"missing working_dir", func(r *pb.RegisterFunctionRequest) { r.WorkingDir = filepath.Join(s.Workspace, "nope") }, "working_dir"},
		{"working_dir is a file", func(r *pb.RegisterFunctionRequest) { r.WorkingDir = file }, "working_dir"},
		{"working_dir outside", func(r *pb.RegisterFunctionRequest) { r.WorkingDir = outside }, "working_dir"},
		{"working_dir symlink outside", func(r *pb.RegisterFunctionRequest) { r.WorkingDir = link }, "working_dir"},
		{"empty handler", func(r *pb.RegisterFunctionRequest) { r.Handler = "" }, "handler"},
		{"handler without function", func(r *pb.RegisterFunctionRequest) { r.Handler = "handler" }, "handler"},
		{"handler with ..", func(r *pb.RegisterFunctionRequest) { r.Handler = "../x.handle" }, "handler"},
		{"handler too long", func(r *pb.RegisterFunctionRequest) { r.Handler = strings.Repeat("a", bounds.Handler) + ".f" }, "handler"},
		{"handler bad function", func(r *pb.RegisterFunctionRequest) { r.Handler = "handler.a-b" }, "handler"},
		{"env bad key", func(r *pb.RegisterFunctionRequest) { r.Env = map[string]string{"1A": "x"} }, "env"},
		{"env key with =", func(r *pb.RegisterFunctionRequest) { r.Env = map[string]string{"A=B": "x"} }, "env"},
		{"env NUL value", func(r *pb.RegisterFunctionRequest) { r.Env = map[string]string{"A": "x\x00y"} }, "env"},
		{"env too many", func(r *pb.RegisterFunctionRequest) { r.Env = bigEnv }, "env"},
		{"idle negative", func(r *pb.RegisterFunctionRequest) { r.IdleTimeoutSeconds = -1 }, "idle_timeout_seconds"},
		{"digest empty", func(r *pb.RegisterFunctionRequest) { r.RegistrationDigest = "" }, "registration_digest"},
		{"digest uppercase", func(r *pb.RegisterFunctionRequest) {
			r.RegistrationDigest = "sha256:" + strings.Repeat("A", 64)
		}, "registration_digest"},
		{"digest short", func(r *pb.RegisterFunctionRequest) { r.RegistrationDigest = "sha256:abc" }, "registration_digest"},
		{"digest no prefix", func(r *pb.RegisterFunctionRequest) { r.RegistrationDigest = strings.Repeat("a", 64) }, "registration_digest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := s.RegisterRequest(t, Echo, "validation-"+strings.ReplaceAll(tt.name, " ", "-"), 1)
			tt.edit(req)
			_, err := s.Functions.RegisterFunction(ctxT(t), req)
			wantCode(t, err, codes.InvalidArgument, tt.field)
			// Nothing was registered under the UID.
			if req.GetRunUid() != "" && len(req.GetRunUid()) <= bounds.RunUID {
				_, err = s.Functions.FunctionStatus(ctxT(t), &pb.FunctionStatusRequest{
					Registration: &pb.FunctionRegistration{RunUid: req.GetRunUid(), RegistrationId: "reg_x"}})
				wantCode(t, err, codes.NotFound)
			}
		})
	}
	t.Run("at the bounds", func(t *testing.T) {
		req := s.RegisterRequest(t, Echo, strings.Repeat("u", bounds.RunUID), 1)
		env := map[string]string{}
		for i := 0; i < bounds.EnvEntries; i++ {
			env[fmt.Sprintf("K%d", i)] = "v"
		}
		req.Env = env
		resp, err := s.Functions.RegisterFunction(ctxT(t), req)
		if err != nil || resp.GetState() != ready {
			t.Fatalf("register at the bounds: %v %v", resp, err)
		}
		unregister(t, s, resp.GetRegistration())
	})
}

func unregister(t testing.TB, s *Server, reg *pb.FunctionRegistration) {
	t.Helper()
	if _, err := s.Functions.UnregisterFunction(ctxT(t), &pb.UnregisterFunctionRequest{Registration: reg, CancelInFlight: true}); err != nil {
		t.Fatalf("unregister: %v", err)
	}
}

func testRegisterFencing(t *testing.T, s *Server) {
	ctx := ctxT(t)
	uid := "fencing"
	req1 := s.RegisterRequest(t, Echo, uid, 1)
	r1, err := s.Functions.RegisterFunction(ctx, req1)
	if err != nil || r1.GetState() != ready {
		t.Fatalf("register: %v %v", r1, err)
	}
	id1 := r1.GetRegistration().GetRegistrationId()
	if id1 == "" || r1.GetRegistration().GetRunUid() != uid {
		t.Fatalf("bad reference %v", r1.GetRegistration())
	}
	// Same UID, attempt and digest: the same reference, not re-initialised.
	before, _ := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: r1.GetRegistration()})
	again, err := s.Functions.RegisterFunction(ctx, req1)
	if err != nil || again.GetRegistration().GetRegistrationId() != id1 || again.GetState() != ready {
		t.Fatalf("repeat register: %v %v, want id %s", again, err, id1)
	}
	after, _ := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: r1.GetRegistration()})
	if after.GetLastActivityUnixNano() != before.GetLastActivityUnixNano() {
		t.Fatal("a repeated register re-initialised the function")
	}
	// Different digest for the same attempt: AlreadyExists, nothing replaced.
	conflict := s.RegisterRequest(t, Echo, uid, 1)
	conflict.RegistrationDigest = Digest("something else")
	_, err = s.Functions.RegisterFunction(ctx, conflict)
	wantCode(t, err, codes.AlreadyExists)
	if _, err := s.Invoke(ctx, r1.GetRegistration(), `1`, 0); err != nil {
		t.Fatalf("registration replaced by a conflicting digest: %v", err)
	}
	// Higher attempt supersedes with a new ID.
	r2, err := s.Functions.RegisterFunction(ctx, s.RegisterRequest(t, Echo, uid, 2))
	if err != nil || r2.GetState() != ready {
		t.Fatalf("register attempt 2: %v %v", r2, err)
	}
	if r2.GetRegistration().GetRegistrationId() == id1 {
		t.Fatal("attempt 2 reused the registration ID")
	}
	// The stale ID can neither read, invoke nor remove the new generation.
	_, err = s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: r1.GetRegistration()})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = s.Invoke(ctx, r1.GetRegistration(), `1`, 0)
	wantCode(t, err, codes.FailedPrecondition)
	_, err = s.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: r1.GetRegistration(), CancelInFlight: true})
	wantCode(t, err, codes.FailedPrecondition)
	out, err := s.Invoke(ctx, r2.GetRegistration(), `{"still":"here"}`, 0)
	if err != nil || string(out.GetOutput()) != `{"still":"here"}` {
		t.Fatalf("new generation disturbed by stale calls: %v %v", out, err)
	}
	// A lower attempt is refused.
	_, err = s.Functions.RegisterFunction(ctx, s.RegisterRequest(t, Echo, uid, 1))
	wantCode(t, err, codes.FailedPrecondition)
	unregister(t, s, r2.GetRegistration())
}

func testRegisterSlowInit(t *testing.T, s *Server) {
	req := s.RegisterRequest(t, SlowInit, "slow-init", 1)
	// The fixture loads until the test opens its gate: it is still loading
	// at the short deadline and at the invocation below, however loaded
	// the machine (it used to sleep 2 s, which a slow invocation outlived).
	gate := filepath.Join(s.Dir(t, Source{}), "gate")
	if err := syscall.Mkfifo(gate, 0o644); err != nil {
		t.Fatal(err)
	}
	req.Env["STOKE_GATE"] = gate
	var opened *os.File
	open := func() {
		if opened != nil {
			return
		}
		// O_RDWR: opening a FIFO so never waits for its reader; held open
		// until the test ends, so that a load that opens it later still
		// reads a line. A line per load, up to 16.
		f, err := os.OpenFile(gate, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		opened = f
		if _, err := f.WriteString(strings.Repeat("\n", 16)); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		open() // a failed test's load ends too
		opened.Close()
	}()

	// The server answers REGISTERING a margin before the caller's deadline
	// (a tenth of the time left, at most a second), which must cover the
	// call's way in and out: the deadline is twenty round trips of a call
	// that does nothing, measured now, on this machine, under its present
	// load (the margin then covers two of them), and at least 3 s (a
	// margin of 300 ms: 50 ms was too little at CI's load).
	var rtt time.Duration
	for range 3 {
		start := time.Now()
		_, err := s.Functions.FunctionStatus(ctxT(t), &pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: "nobody", RegistrationId: "reg_x"}})
		wantCode(t, err, codes.NotFound)
		rtt = max(rtt, time.Since(start))
	}
	short, cancel := context.WithTimeout(context.Background(), min(max(20*rtt, 3*time.Second), 10*time.Second))
	defer cancel()
	resp, err := s.Functions.RegisterFunction(short, req)
	if err != nil {
		t.Fatalf("register with a deadline before the load ends (round trip %s): %v", rtt, err)
	}
	if resp.GetState() != register {
		t.Fatalf("state %v, want REGISTERING", resp.GetState())
	}
	// Invocations wait for nobody: not ready is FailedPrecondition.
	_, err = s.Invoke(ctxT(t), resp.GetRegistration(), `1`, 0)
	wantCode(t, err, codes.FailedPrecondition)
	// Loading goes on; once it ends, the same request returns the same
	// reference, READY.
	open()
	again, err := s.Functions.RegisterFunction(ctxT(t), req)
	if err != nil || again.GetState() != ready || again.GetRegistration().GetRegistrationId() != resp.GetRegistration().GetRegistrationId() {
		t.Fatalf("repeat register: %v %v", again, err)
	}
	unregister(t, s, again.GetRegistration())
}

func testInitFailures(t *testing.T, s *Server) {
	for _, f := range []Fixture{SyntaxError, MissingFunction, MissingFile} {
		t.Run(string(f), func(t *testing.T) {
			ctx := ctxT(t)
			req := s.RegisterRequest(t, f, "init-"+string(f), 1)
			resp, err := s.Functions.RegisterFunction(ctx, req)
			if err != nil {
				t.Fatalf("register: %v", err)
			}
			if resp.GetState() != failed {
				t.Fatalf("state %v, want FAILED", resp.GetState())
			}
			st, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
			if err != nil || st.GetState() != failed {
				t.Fatalf("status: %v %v", st, err)
			}
			if st.GetFatalError() == "" || len(st.GetFatalError()) > bounds.Message {
				t.Fatalf("fatal_error %q: want non-empty and at most %d bytes", st.GetFatalError(), bounds.Message)
			}
			_, err = s.Invoke(ctx, resp.GetRegistration(), `1`, 0)
			wantCode(t, err, codes.FailedPrecondition)
			// The same request returns the FAILED reference, not a retry.
			again, err := s.Functions.RegisterFunction(ctx, req)
			if err != nil || again.GetState() != failed || again.GetRegistration().GetRegistrationId() != resp.GetRegistration().GetRegistrationId() {
				t.Fatalf("repeat register: %v %v", again, err)
			}
			unregister(t, s, resp.GetRegistration())
		})
	}
}

func testStatus(t *testing.T, s *Server) {
	ctx := ctxT(t)
	_, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: "nobody", RegistrationId: "reg_x"}})
	wantCode(t, err, codes.NotFound)
	_, err = s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: "nobody"}})
	wantCode(t, err, codes.InvalidArgument, "registration_id")

	begin := time.Now().UnixNano()
	reg := s.Register(t, Echo, "status")
	st, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil || st.GetState() != ready || st.GetInFlight() != 0 {
		t.Fatalf("status: %v %v", st, err)
	}
	if st.GetLastActivityUnixNano() < begin {
		t.Fatalf("last_activity %d not set at READY (test began %d)", st.GetLastActivityUnixNano(), begin)
	}
	if _, err := s.Invoke(ctx, reg, `1`, 0); err != nil {
		t.Fatal(err)
	}
	st2, _ := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if st2.GetLastActivityUnixNano() <= st.GetLastActivityUnixNano() {
		t.Fatalf("last_activity not advanced by an invocation: %d then %d", st.GetLastActivityUnixNano(), st2.GetLastActivityUnixNano())
	}
	unregister(t, s, reg)
}

func testInvokeEcho(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Echo, "echo")
	defer unregister(t, s, reg)
	inputs := []string{
		`{"command":"status"}`, `1`, `"text"`, `[1,2,{"a":null}]`, `"ünïcødé ☃ 𝄞"`,
		`{"shell":"$(touch /tmp/pwned) ` + "`id`" + ` ; rm -rf / * \" ' \\n"}`,
	}
	for _, in := range inputs {
		resp, err := s.Functions.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(in), InvocationId: "inv-echo-1"})
		if err != nil {
			t.Fatalf("invoke %s: %v", in, err)
		}
		if got := strings.TrimSpace(string(resp.GetOutput())); got != in {
			t.Errorf("output %q, want %q", got, in)
		}
		if resp.GetInvocationId() != "inv-echo-1" || resp.GetContentType() != "application/json" {
			t.Errorf("response %v: want invocation id echoed and JSON content type", resp)
		}
		if resp.GetRegistration().GetRegistrationId() != reg.GetRegistrationId() {
			t.Errorf("response registration %v, want %v", resp.GetRegistration(), reg)
		}
	}
	// An empty invocation ID is generated, and differs between calls.
	a, err1 := s.Invoke(ctx, reg, `1`, 0)
	b, err2 := s.Invoke(ctx, reg, `1`, 0)
	if err1 != nil || err2 != nil || a.GetInvocationId() == "" || a.GetInvocationId() == b.GetInvocationId() {
		t.Fatalf("generated invocation ids %q %q (%v %v)", a.GetInvocationId(), b.GetInvocationId(), err1, err2)
	}
	// An input exactly at the bound is accepted.
	atBound := `"` + strings.Repeat("x", bounds.InvokeBody-2) + `"`
	resp, err := s.Invoke(ctx, reg, atBound, 0)
	if err != nil || strings.TrimSpace(string(resp.GetOutput())) != atBound {
		t.Fatalf("input at the bound: %v", err)
	}
	// An invocation ID exactly at the bound is accepted.
	id := strings.Repeat("i", bounds.InvocationID)
	resp, err = s.Functions.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), InvocationId: id})
	if err != nil || resp.GetInvocationId() != id {
		t.Fatalf("invocation id at the bound: %v", err)
	}
}

func testInvokeValidation(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Echo, "invoke-validation")
	defer unregister(t, s, reg)
	tests := []struct {
		name  string
		req   *pb.InvokeFunctionRequest
		code  codes.Code
		field string
	}{
		{"invocation id too long", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), InvocationId: strings.Repeat("i", bounds.InvocationID+1)}, codes.InvalidArgument, "invocation_id"},
		{"content type", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), ContentType: "text/plain"}, codes.InvalidArgument, "content_type"},
		{"not JSON", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`{nope`)}, codes.InvalidArgument, "input"},
		{"not UTF-8", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte("{\"name\":\"\xff\"}")}, codes.InvalidArgument, "input"},
		{"empty input", &pb.InvokeFunctionRequest{Registration: reg}, codes.InvalidArgument, "input"},
		{"input over the bound", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`"` + strings.Repeat("x", bounds.InvokeBody-1) + `"`)}, codes.InvalidArgument, "input"},
		{"negative timeout", &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), TimeoutMillis: -1}, codes.InvalidArgument, "timeout_millis"},
		{"unknown uid", &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: "nobody", RegistrationId: "reg_x"}, Input: []byte(`1`)}, codes.NotFound, ""},
		{"stale id", &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: reg.GetRunUid(), RegistrationId: "reg_old"}, Input: []byte(`1`)}, codes.FailedPrecondition, ""},
		{"empty registration id", &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: reg.GetRunUid()}, Input: []byte(`1`)}, codes.InvalidArgument, "registration_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Functions.InvokeFunction(ctx, tt.req)
			if tt.field != "" {
				wantCode(t, err, tt.code, tt.field)
			} else {
				wantCode(t, err, tt.code)
			}
		})
	}
	// JSON content type with parameters is accepted.
	if _, err := s.Functions.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), ContentType: "application/json; charset=utf-8"}); err != nil {
		t.Fatalf("application/json with charset: %v", err)
	}
}

// WaitInFlight waits until reg has an invocation in flight.
func WaitInFlight(t testing.TB, s *Server, reg *pb.FunctionRegistration) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := s.Functions.FunctionStatus(ctxT(t), &pb.FunctionStatusRequest{Registration: reg})
		if err == nil && st.GetInFlight() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no invocation in flight: %v %v", st, err)
		}
		time.Sleep(2 * time.Millisecond) // polling an observable state, not synchronising on time
	}
}

func testInvokeBusy(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Sleep, "busy")
	defer unregister(t, s, reg)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Invoke(ctx, reg, `1500`, 0)
		errc <- err
	}()
	WaitInFlight(t, s, reg)
	start := time.Now()
	_, err := s.Invoke(ctx, reg, `1`, 0)
	wantCode(t, err, codes.ResourceExhausted)
	if d := time.Since(start); d > time.Second {
		t.Errorf("busy rejection took %s; it must not queue", d)
	}
	if err := <-errc; err != nil {
		t.Fatalf("first invocation: %v", err)
	}
	// The slot is free again.
	if _, err := s.Invoke(ctx, reg, `1`, 0); err != nil {
		t.Fatalf("after the busy period: %v", err)
	}
}

func testInvokeTimeout(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Sleep, "timeout")
	defer unregister(t, s, reg)
	for i := 0; i < 2; i++ {
		_, err := s.Invoke(ctx, reg, `20000`, 200)
		wantCode(t, err, codes.DeadlineExceeded)
		st, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
		if err != nil || st.GetState() != ready {
			t.Fatalf("after a timeout: %v %v, want READY", st, err)
		}
		resp, err := s.Invoke(ctx, reg, `1`, 10000)
		if err != nil || strings.TrimSpace(string(resp.GetOutput())) != "true" {
			t.Fatalf("invocation after a timeout: %v %v", resp, err)
		}
	}
	// A timeout larger than the server's maximum is clamped, not refused.
	if _, err := s.Invoke(ctx, reg, `1`, 1<<40); err != nil {
		t.Fatalf("huge timeout: %v", err)
	}
}

func testFunctionError(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Fail, "fail")
	defer unregister(t, s, reg)
	resp, err := s.Functions.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`1`), InvocationId: "inv-fail"})
	if err == nil {
		t.Fatalf("want a function error, got %v", resp)
	}
	errorType, st := functionError(t, err)
	if errorType == "" || !strings.Contains(st.Message(), "boom") && !strings.Contains(errorType, "Exit") {
		t.Fatalf("errorType %q message %q", errorType, st.Message())
	}
	if len(st.Message()) > bounds.Message+256 {
		t.Fatalf("message is %d bytes", len(st.Message()))
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["invocationId"] != "inv-fail" {
			t.Fatalf("invocationId %q, want inv-fail", info.GetMetadata()["invocationId"])
		}
	}
	// A handler failure leaves the registration READY.
	sr, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil || sr.GetState() != ready {
		t.Fatalf("after a handler failure: %v %v", sr, err)
	}
}

func testOutputs(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Outputs, "outputs")
	defer unregister(t, s, reg)
	resp, err := s.Invoke(ctx, reg, `1`, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetOutputs(); got["greeting"] != "hello" || got["count"] != "2" || len(got) != 2 {
		t.Fatalf("outputs %v", got)
	}
	// Outputs do not leak into the next invocation's outputs map beyond
	// what it sets itself.
	resp, err = s.Invoke(ctx, reg, `2`, 0)
	if err != nil || len(resp.GetOutputs()) != 2 {
		t.Fatalf("second invocation outputs %v %v", resp.GetOutputs(), err)
	}

	regV := s.Register(t, OutputValue, "output-value")
	defer unregister(t, s, regV)
	resp, err = s.Invoke(ctx, regV, fmt.Sprint(bounds.OutputValue), 0)
	if err != nil || len(resp.GetOutputs()["v"]) != bounds.OutputValue {
		t.Fatalf("output value at the bound: %v", err)
	}
	_, err = s.Invoke(ctx, regV, fmt.Sprint(bounds.OutputValue+1), 0)
	if typ, _ := functionError(t, err); typ != errdefs.RuntimeInvalidOutputs {
		t.Fatalf("errorType %q, want Runtime.InvalidOutputs", typ)
	}
}

func testOutputBound(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, BigOutput, "big-output")
	defer unregister(t, s, reg)
	resp, err := s.Invoke(ctx, reg, fmt.Sprint(bounds.InvokeBody-2), 0)
	if err != nil || len(strings.TrimSpace(string(resp.GetOutput()))) != bounds.InvokeBody {
		t.Fatalf("output at the bound: %v", err)
	}
	_, err = s.Invoke(ctx, reg, fmt.Sprint(bounds.InvokeBody+10), 0)
	if typ, _ := functionError(t, err); typ != errdefs.RuntimeOutputTooLarge {
		t.Fatalf("errorType %q, want Runtime.OutputTooLarge", typ)
	}
	// A flood far past the bound is cut off and the next call is clean.
	_, err = s.Invoke(ctx, reg, fmt.Sprint(16*bounds.InvokeBody), 0)
	if typ, _ := functionError(t, err); typ != errdefs.RuntimeOutputTooLarge {
		t.Fatalf("errorType %q, want Runtime.OutputTooLarge", typ)
	}
	resp, err = s.Invoke(ctx, reg, `3`, 0)
	if err != nil || strings.TrimSpace(string(resp.GetOutput())) != `"xxx"` {
		t.Fatalf("after a flood: %q %v", resp.GetOutput(), err)
	}
}

func testEnv(t *testing.T, s *Server) {
	ctx := ctxT(t)
	if os.Getenv(ServerSecretEnv) == "" {
		t.Fatalf("the harness's TestMain must set %s in the server's environment", ServerSecretEnv)
	}
	req := s.RegisterRequest(t, Env, "env", 1)
	req.Env["GREETING"] = "hi there; $(id)"
	resp, err := s.Functions.RegisterFunction(ctx, req)
	if err != nil || resp.GetState() != ready {
		t.Fatalf("register: %v %v", resp, err)
	}
	reg := resp.GetRegistration()
	defer unregister(t, s, reg)
	cases := map[string]string{
		`"GREETING"`:                `"hi there; $(id)"`,
		`"` + ServerSecretEnv + `"`: `""`,
		`"LANG"`:                    `"C.UTF-8"`,
	}
	for in, want := range cases {
		out, err := s.Invoke(ctx, reg, in, 0)
		if err != nil || strings.TrimSpace(string(out.GetOutput())) != want {
			t.Errorf("env %s = %q (%v), want %s", in, out.GetOutput(), err, want)
		}
	}
	// HOME is the directory the code runs in: working_dir, or its copy.
	out, err := s.Invoke(ctx, reg, `"HOME"`, 0)
	if err != nil {
		t.Fatal(err)
	}
	var home string
	if err := json.Unmarshal(out.GetOutput(), &home); err != nil {
		t.Fatalf("HOME %q: %v", out.GetOutput(), err)
	}
	s.wantCodeDir(t, "HOME", home, req.GetWorkingDir(), s.h.Fixtures(Env))

	pwdReg := s.Register(t, Pwd, "pwd")
	defer unregister(t, s, pwdReg)
	out, err = s.Invoke(ctx, pwdReg, `1`, 0)
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	if err := json.Unmarshal(out.GetOutput(), &dir); err != nil {
		t.Fatalf("pwd %q: %v", out.GetOutput(), err)
	}
	s.wantCodeDir(t, "the working directory", dir, "", s.h.Fixtures(Pwd))
}

// wantCodeDir checks that dir, where a handler's code runs, is workingDir
// (any directory inside the workspace when workingDir is ""), or, for a
// server that runs a copy, a directory outside it holding src's files.
func (s *Server) wantCodeDir(t *testing.T, what, dir, workingDir string, src Source) {
	t.Helper()
	if s.h.RunsACopy == "" {
		if workingDir != "" && dir != workingDir || !strings.HasPrefix(dir, s.Workspace) {
			t.Fatalf("%s is %q, want working_dir %q inside %s", what, dir, workingDir, s.Workspace)
		}
		return
	}
	t.Logf("%s is a copy of working_dir: %s", what, s.h.RunsACopy)
	if strings.HasPrefix(dir, s.Workspace) {
		t.Fatalf("%s is %q, inside the workspace: want the copy the server runs", what, dir)
	}
	for name, text := range src.Files {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != text {
			t.Fatalf("%s %q does not hold the registration's %s: %q %v", what, dir, name, b, err)
		}
	}
}

func testStderrFlood(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, StderrFlood, "stderr-flood")
	defer unregister(t, s, reg)
	for i := 0; i < 2; i++ {
		out, err := s.Invoke(ctx, reg, fmt.Sprint(10<<20), 20000)
		if err != nil || strings.TrimSpace(string(out.GetOutput())) != `"ok"` {
			t.Fatalf("stderr flood: %q %v", out.GetOutput(), err)
		}
	}
}

func testProcessExit(t *testing.T, s *Server) {
	ctx := ctxT(t)
	reg := s.Register(t, Exit, "exit")
	defer unregister(t, s, reg)
	_, err := s.Invoke(ctx, reg, `1`, 0)
	functionError(t, err)
	// The registration stays READY and serves again (a dead worker is
	// replaced, a dead child is simply not reused).
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := s.Invoke(ctx, reg, `"again"`, 0)
		if err == nil {
			break
		}
		if code := status.Code(err); code != codes.ResourceExhausted && code != codes.Unknown || time.Now().After(deadline) {
			t.Fatalf("after the process exited: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st, err := s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
	if err != nil || st.GetState() != ready {
		t.Fatalf("state after a process exit: %v %v", st, err)
	}
}

func testUnregister(t *testing.T, s *Server) {
	t.Run("absent", func(t *testing.T) {
		_, err := s.Functions.UnregisterFunction(ctxT(t), &pb.UnregisterFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: "absent", RegistrationId: "reg_x"}})
		if err != nil {
			t.Fatalf("unregister absent: %v", err)
		}
	})
	t.Run("drain waits", func(t *testing.T) {
		ctx := ctxT(t)
		reg := s.Register(t, Sleep, "drain-wait")
		errc := make(chan error, 1)
		go func() {
			_, err := s.Invoke(ctx, reg, `3000`, 0)
			errc <- err
		}()
		WaitInFlight(t, s, reg)
		unregistered := make(chan error, 1)
		go func() {
			_, err := s.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: reg, DrainTimeoutMillis: 20000})
			unregistered <- err
		}()
		// While draining, new invocations are refused.
		waitState(t, s, reg, draining)
		_, err := s.Invoke(ctx, reg, `1`, 0)
		wantCode(t, err, codes.FailedPrecondition)
		if err := <-errc; err != nil {
			t.Fatalf("drained invocation failed: %v", err)
		}
		if err := <-unregistered; err != nil {
			t.Fatalf("unregister: %v", err)
		}
		_, err = s.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: reg})
		wantCode(t, err, codes.NotFound)
	})
	t.Run("drain timeout cancels", func(t *testing.T) {
		ctx := ctxT(t)
		reg := s.Register(t, Sleep, "drain-timeout")
		errc := make(chan error, 1)
		go func() {
			_, err := s.Invoke(ctx, reg, `30000`, 0)
			errc <- err
		}()
		WaitInFlight(t, s, reg)
		start := time.Now()
		if _, err := s.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: reg, DrainTimeoutMillis: 200}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("unregister took %s with a 200ms drain", d)
		}
		err := <-errc
		if err == nil || status.Code(err) == codes.OK {
			t.Fatal("the in-flight invocation was not cancelled")
		}
	})
	t.Run("cancel in flight", func(t *testing.T) {
		ctx := ctxT(t)
		reg := s.Register(t, Sleep, "cancel-in-flight")
		errc := make(chan error, 1)
		go func() {
			_, err := s.Invoke(ctx, reg, `30000`, 0)
			errc <- err
		}()
		WaitInFlight(t, s, reg)
		if _, err := s.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: reg, CancelInFlight: true, DrainTimeoutMillis: 60000}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, <-errc, codes.FailedPrecondition)
		// Unregistering again is fine: the registration is absent now.
		unregister(t, s, reg)
	})
	t.Run("failed registration", func(t *testing.T) {
		resp, err := s.Functions.RegisterFunction(ctxT(t), s.RegisterRequest(t, MissingFunction, "unregister-failed", 1))
		if err != nil {
			t.Fatal(err)
		}
		unregister(t, s, resp.GetRegistration())
	})
}

func waitState(t testing.TB, s *Server, reg *pb.FunctionRegistration, want pb.FunctionRegistrationState) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := s.Functions.FunctionStatus(ctxT(t), &pb.FunctionStatusRequest{Registration: reg})
		if err == nil && st.GetState() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("state never became %v: %v %v", want, st, err)
		}
		time.Sleep(2 * time.Millisecond) // polling an observable state
	}
}

func testTask(t *testing.T, s *Server) {
	ctx := ctxT(t)
	okDir := s.Dir(t, s.h.TaskOK)
	var entry string
	for name := range s.h.TaskOK.Files {
		entry = name
	}
	wait := func(id string) *pb.StatusResponse {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		st, err := s.Runtime.Wait(wctx, &pb.StatusRequest{Id: id})
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		return st
	}
	t.Run("succeeds", func(t *testing.T) {
		if _, err := s.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-ok", WorkingDir: okDir, Entrypoint: entry}); err != nil {
			t.Fatal(err)
		}
		// A repeated id returns the existing execution.
		if r, err := s.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-ok", WorkingDir: okDir, Entrypoint: entry}); err != nil || r.GetId() != "task-ok" {
			t.Fatalf("repeat execute: %v %v", r, err)
		}
		st := wait("task-ok")
		if st.GetState() != pb.ExecutionState_EXECUTION_STATE_SUCCEEDED || st.GetExitCode() != 0 ||
			!strings.Contains(st.GetStdout(), "hello") || st.GetOutputs()["RESULT"] != "done" {
			t.Fatalf("status %v", st)
		}
		list, err := s.Runtime.List(ctx, &pb.ListRequest{})
		if err != nil || len(list.GetEntries()) == 0 {
			t.Fatalf("list: %v %v", list, err)
		}
		if _, err := s.Runtime.Forget(ctx, &pb.ForgetRequest{Id: "task-ok"}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Runtime.Status(ctx, &pb.StatusRequest{Id: "task-ok"})
		wantCode(t, err, codes.NotFound)
	})
	t.Run("handler refused", func(t *testing.T) {
		_, err := s.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-handler", WorkingDir: okDir, Entrypoint: entry, Handler: "x.y"})
		wantCode(t, err, codes.InvalidArgument, "handler")
	})
	sleepDir := s.Dir(t, s.h.TaskSleep)
	var sleepEntry string
	for name := range s.h.TaskSleep.Files {
		sleepEntry = name
	}
	t.Run("timeout", func(t *testing.T) {
		if _, err := s.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-timeout", WorkingDir: sleepDir, Entrypoint: sleepEntry, TimeoutSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		if st := wait("task-timeout"); st.GetState() != pb.ExecutionState_EXECUTION_STATE_TIMED_OUT {
			t.Fatalf("state %v, want TIMED_OUT", st.GetState())
		}
	})
	t.Run("cancel and forget", func(t *testing.T) {
		if _, err := s.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-cancel", WorkingDir: sleepDir, Entrypoint: sleepEntry}); err != nil {
			t.Fatal(err)
		}
		_, err := s.Runtime.Forget(ctx, &pb.ForgetRequest{Id: "task-cancel"})
		wantCode(t, err, codes.FailedPrecondition)
		if _, err := s.Runtime.Cancel(ctx, &pb.CancelRequest{Id: "task-cancel"}); err != nil {
			t.Fatal(err)
		}
		if st := wait("task-cancel"); st.GetState() != pb.ExecutionState_EXECUTION_STATE_CANCELLED {
			t.Fatalf("state %v, want CANCELLED", st.GetState())
		}
		if _, err := s.Runtime.Forget(ctx, &pb.ForgetRequest{Id: "task-cancel"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("health", func(t *testing.T) {
		h, err := s.Runtime.Health(ctx, &pb.HealthRequest{})
		if err != nil || !h.GetHealthy() {
			t.Fatalf("health %v %v", h, err)
		}
	})
}
