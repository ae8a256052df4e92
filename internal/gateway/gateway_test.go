package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/standalone"
	"stoke.dev/stoke/internal/testbin"
)

const token = "gateway-test-token"

// plane is the one control plane the tests share: a real standalone Stoke
// (SQLite store, a bash pod of the built stoke binary), behind no gateway;
// each test puts the gateway it needs in front of it.
var plane *standalone.Standalone

var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	dataDir, err := os.MkdirTemp("", "stoke-gateway-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dataDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bash := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "bash", Namespace: "default"},
		Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 4}}
	s, err := standalone.New(ctx, standalone.Config{DataDir: dataDir, DefaultRuntimes: []*v1alpha1.Runtime{bash},
		Logger:         quiet,
		PodCommand:     func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(bin, args...) },
		HealthInterval: 200 * time.Millisecond, StatusPoll: 100 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	plane = s
	return m.Run()
}

// serve puts a gateway over the shared plane on a loopback HTTP server, as
// `stoke up` does: its listener wrapped, its server's timeouts set.
func serve(t testing.TB, cfg gateway.Config) string {
	t.Helper()
	if cfg.API == nil {
		cfg.API = plane
	}
	cfg.Token = token
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	g := gateway.New(cfg)
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.Server()
	srv.Listener = gateway.Listener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return fmt.Sprintf("%d %.500s", r.status, r.body) }

// do sends a request with the token unless hdr sets Authorization ("" sends
// none).
func do(t testing.TB, method, url, body string, hdr map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// wantError checks a documented error answer: the status, a JSON body
// with errorType and a message, and on the invoke path an invocation ID
// in the body and the header.
func wantError(t *testing.T, r reply, status int, errorType string, invoke bool) httpapi.ErrorBody {
	t.Helper()
	var body httpapi.ErrorBody
	if r.status != status {
		t.Errorf("status %d, want %d: %s", r.status, status, r)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json: %s", ct, r)
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("error body %s: %v", r, err)
	}
	if body.ErrorType != errorType || body.ErrorMessage == "" {
		t.Errorf("error body %+v, want errorType %s and a message", body, errorType)
	}
	if id := r.header.Get(httpapi.HeaderInvocationID); invoke && (id == "" || id != body.InvocationID) {
		t.Errorf("invocation id: header %q, body %q", id, body.InvocationID)
	}
	return body
}

const runJSON = `{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":%q},
 "spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`

func runYAML(name string) string {
	return fmt.Sprintf("apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata:\n  name: %s\nspec:\n  runtime: bash\n  mode:\n    task:\n      args: [\"true\"]\n", name)
}

// Every error of the object API is the documented JSON body with the
// status of errdefs' table, and a refused create stores nothing.
func TestObjectErrors(t *testing.T) {
	url := serve(t, gateway.Config{})
	runs := url + "/v1/namespaces/default/runs"
	if r := do(t, http.MethodPost, runs, fmt.Sprintf(runJSON, "exists"), nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", "exists") })
	yaml := map[string]string{"Content-Type": "application/yaml"}
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		errorType                string
	}{
		{"no token", http.MethodGet, "/v1/runs", "", map[string]string{"Authorization": ""}, 401, "Stoke.Unauthenticated"},
		{"wrong token", http.MethodGet, "/v1/runs", "", map[string]string{"Authorization": "Bearer nope"}, 401, "Stoke.Unauthenticated"},
		{"no such path", http.MethodGet, "/v2/anything", "", nil, 404, "Stoke.NotFound"},
		{"method not allowed", http.MethodPut, "/v1/namespaces/default/runs/exists", "{}", nil, 405, "Stoke.Unimplemented"},
		{"bad JSON", http.MethodPost, "/v1/namespaces/default/runs", "{", nil, 400, "Stoke.InvalidArgument"},
		{"unknown field", http.MethodPost, "/v1/namespaces/default/runs", `{"spec":{"nope":1}}`, nil, 400, "Stoke.InvalidArgument"},
		{"two JSON objects", http.MethodPost, "/v1/namespaces/default/runs", fmt.Sprintf(runJSON, "two-a") + fmt.Sprintf(runJSON, "two-b"), nil, 400, "Stoke.InvalidArgument"},
		{"two YAML documents", http.MethodPost, "/v1/namespaces/default/runs", runYAML("multi-a") + "---\n" + runYAML("multi-b"), yaml, 400, "Stoke.InvalidArgument"},
		{"bad YAML", http.MethodPost, "/v1/namespaces/default/runs", "a: [", yaml, 400, "Stoke.InvalidArgument"},
		{"content type", http.MethodPost, "/v1/namespaces/default/runs", "x", map[string]string{"Content-Type": "text/plain"}, 400, "Stoke.InvalidArgument"},
		{"namespace mismatch", http.MethodPost, "/v1/namespaces/other/runs", strings.Replace(fmt.Sprintf(runJSON, "elsewhere"), `"name"`, `"namespace":"default","name"`, 1), nil, 400, "Stoke.InvalidArgument"},
		{"invalid run", http.MethodPost, "/v1/namespaces/default/runs", `{"metadata":{"name":"Not_A_Name"},"spec":{"runtime":"bash"}}`, nil, 400, "Stoke.InvalidArgument"},
		{"unknown runtime", http.MethodPost, "/v1/namespaces/default/runs", strings.Replace(fmt.Sprintf(runJSON, "noruntime"), `"bash"`, `"ruby"`, 1), nil, 400, "Stoke.InvalidArgument"},
		{"over 4 MiB", http.MethodPost, "/v1/namespaces/default/runs", `{"x":"` + strings.Repeat("x", bounds.ObjectBody) + `"}`, nil, 413, "Stoke.InvalidArgument"},
		{"name taken", http.MethodPost, "/v1/namespaces/default/runs", fmt.Sprintf(runJSON, "exists"), nil, 409, "Stoke.AlreadyExists"},
		{"get missing", http.MethodGet, "/v1/namespaces/default/runs/missing", "", nil, 404, "Stoke.NotFound"},
		{"cancel missing", http.MethodPost, "/v1/namespaces/default/runs/missing/cancel", "", nil, 404, "Stoke.NotFound"},
		{"delete missing", http.MethodDelete, "/v1/namespaces/default/runs/missing", "", nil, 404, "Stoke.NotFound"},
		{"logs of missing", http.MethodGet, "/v1/namespaces/default/runs/missing/logs", "", nil, 404, "Stoke.NotFound"},
		{"bad selector", http.MethodGet, "/v1/namespaces/default/runs?labelSelector=a%20in%20(", "", nil, 400, "Stoke.InvalidArgument"},
		{"bad watch version", http.MethodGet, "/v1/namespaces/default/runs?watch=true&resourceVersion=abc", "", nil, 400, "Stoke.InvalidArgument"},
		{"runtime name mismatch", http.MethodPut, "/v1/namespaces/default/runtimes/a", `{"metadata":{"name":"b"},"spec":{"server":"bash","runs":1}}`, nil, 400, "Stoke.InvalidArgument"},
		{"runtime server changed", http.MethodPut, "/v1/namespaces/default/runtimes/bash", `{"spec":{"server":"python","replicas":1,"runs":4}}`, nil, 400, "Stoke.InvalidArgument"},
		{"get missing runtime", http.MethodGet, "/v1/namespaces/default/runtimes/missing", "", nil, 404, "Stoke.NotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, url+tt.path, tt.body, tt.hdr)
			wantError(t, r, tt.status, tt.errorType, false)
			if tt.status == http.StatusMethodNotAllowed && !strings.Contains(r.header.Get("Allow"), "GET") {
				t.Errorf("405 without Allow: %v", r.header)
			}
			if tt.status == http.StatusUnauthorized && r.header.Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate")
			}
		})
	}
	list := do(t, http.MethodGet, url+"/v1/runs", "", nil)
	for _, refused := range []string{"two-a", "two-b", "multi-a", "multi-b", "elsewhere", "noruntime"} {
		if strings.Contains(string(list.body), `"`+refused+`"`) {
			t.Errorf("refused Run %s was stored: %s", refused, list.body)
		}
	}
	if r := do(t, http.MethodGet, url+"/v1/namespaces/default/runtimes/bash", "", nil); !strings.Contains(string(r.body), `"server":"bash"`) {
		t.Errorf("the refused runtime update changed it: %s", r)
	}
	// One YAML document, with comments and a document marker, is taken.
	one := "# a comment\n---\n" + runYAML("one-doc") + "---\n# nothing here\n"
	if r := do(t, http.MethodPost, runs, one, yaml); r.status != http.StatusCreated {
		t.Errorf("one YAML document: %s", r)
	}
	_, _ = plane.DeleteRun(context.Background(), "default", "one-doc")
}

const bashHandler = `handle() {
	case "$1" in
	'"fail"') echo boom >&2; exit 3 ;;
	'"slow"') sleep 3 ;;
	esac
	printf '{"got":%s}' "$1"
}
`

// readyFunction creates a Ready bash function Run and returns its
// invoke URL under url.
func readyFunction(t *testing.T, url, name string) string {
	t.Helper()
	ctx := context.Background()
	_, err := plane.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.sh", Text: bashHandler}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", name) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		run, err := plane.GetRun(ctx, "default", name)
		if err == nil && run.Status.Phase == v1alpha1.PhaseReady {
			return url + "/v1/namespaces/default/runs/" + name + "/" + string(run.UID) + "/invoke"
		}
		if err != nil || run.Status.Phase.Terminal() || time.Now().After(deadline) {
			t.Fatalf("function %s never Ready: %v %+v", name, err, run)
		}
		time.Sleep(10 * time.Millisecond) // polling an observable state
	}
}

// Every error of the invoke path is the documented JSON body with an
// invocation ID in the body and the header.
func TestInvokeErrors(t *testing.T) {
	url := serve(t, gateway.Config{})
	fn := readyFunction(t, url, "invoke-errors")
	if r := do(t, http.MethodPost, fn, `"hi"`, nil); r.status != http.StatusOK || string(r.body) != `{"got":"hi"}` || r.header.Get(httpapi.HeaderInvocationID) == "" {
		t.Fatalf("invoke: %s %v", r, r.header)
	}
	task, err := plane.CreateRun(context.Background(), &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "not-a-function", Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", task.Name) })
	taskURL := url + "/v1/namespaces/default/runs/not-a-function/" + string(task.UID) + "/invoke"
	wrongUID := strings.Replace(fn, "/invoke-errors/", "/invoke-errors/x", 1)
	tests := []struct {
		name, url, body string
		hdr             map[string]string
		status          int
		errorType       string
	}{
		{"wrong uid", wrongUID, `1`, nil, 404, "Stoke.NotFound"},
		{"not a function", taskURL, `1`, nil, 503, "Stoke.FailedPrecondition"},
		{"not JSON", fn, `{nope`, nil, 400, "Stoke.InvalidArgument"},
		{"not UTF-8", fn, "\"\xff\"", nil, 400, "Stoke.InvalidArgument"},
		{"body over 1 MiB", fn, `"` + strings.Repeat("x", bounds.InvokeBody) + `"`, nil, 413, "Stoke.InvalidArgument"},
		{"bad timeout", fn, `1`, map[string]string{httpapi.HeaderTimeout: "soon"}, 400, "Stoke.InvalidArgument"},
		{"id too long", fn, `1`, map[string]string{httpapi.HeaderInvocationID: strings.Repeat("i", bounds.InvocationID+1)}, 400, "Stoke.InvalidArgument"},
		{"id with a tab", fn, `1`, map[string]string{httpapi.HeaderInvocationID: "a\tb"}, 400, "Stoke.InvalidArgument"},
		{"id with a space", fn, `1`, map[string]string{httpapi.HeaderInvocationID: "a b"}, 400, "Stoke.InvalidArgument"},
		{"handler failed", fn, `"fail"`, nil, 500, "Runtime.ExitError"},
		{"timed out", fn, `"slow"`, map[string]string{httpapi.HeaderTimeout: "100"}, 504, "Stoke.DeadlineExceeded"},
		{"method not allowed", fn, ``, map[string]string{"X-Method": "GET"}, 405, "Stoke.Unimplemented"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodPost
			if m := tt.hdr["X-Method"]; m != "" {
				method = m
			}
			r := do(t, method, tt.url, tt.body, tt.hdr)
			body := wantError(t, r, tt.status, tt.errorType, method == http.MethodPost)
			if id := tt.hdr[httpapi.HeaderInvocationID]; id != "" && body.InvocationID == id {
				t.Errorf("a refused invocation ID was echoed: %q", id)
			}
		})
	}
	// A call while another is in flight is 429 at once; the first is
	// unharmed. (The slow call itself may meet a probe in flight and be
	// refused: then it is sent again.)
	slow := func() <-chan reply {
		done := make(chan reply, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, fn, strings.NewReader(`"slow"`))
			req.Header.Set("Authorization", "Bearer "+token)
			var r reply
			if resp, err := http.DefaultClient.Do(req); err == nil {
				r.status, r.header = resp.StatusCode, resp.Header
				r.body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			done <- r
		}()
		return done
	}
	first := slow()
	deadline := time.Now().Add(30 * time.Second)
	for refused := false; !refused; {
		select {
		case r := <-first:
			if r.status != http.StatusTooManyRequests || time.Now().After(deadline) {
				t.Fatalf("the slow call ended before any call beside it was refused: %s", r)
			}
			first = slow()
			continue
		default:
		}
		r := do(t, http.MethodPost, fn, `"fast"`, nil)
		switch {
		case r.status == http.StatusTooManyRequests:
			wantError(t, r, http.StatusTooManyRequests, "Stoke.ResourceExhausted", true)
			refused = true
		case r.status != http.StatusOK || time.Now().After(deadline):
			t.Fatalf("call beside a slow one: %s", r)
		}
	}
	if r := <-first; r.status != http.StatusOK || string(r.body) != `{"got":"slow"}` {
		t.Errorf("the slow call: %s", r)
	}
	// A given, fit ID is echoed, on errors too.
	r := do(t, http.MethodPost, fn, `"fail"`, map[string]string{httpapi.HeaderInvocationID: "trace-1"})
	if body := wantError(t, r, 500, "Runtime.ExitError", true); body.InvocationID != "trace-1" {
		t.Errorf("invocation id %q, want trace-1", body.InvocationID)
	}
}

// rawRequest writes req on a new TCP connection and returns the answer's
// status line, headers and body.
func rawRequest(t *testing.T, url, req string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// A request net/http refuses before any handler (a control character in a
// header) gets the JSON error body and an invocation ID, not Go's plain
// text.
func TestMalformedRequestIsJSON(t *testing.T) {
	url := serve(t, gateway.Config{})
	for name, req := range map[string]string{
		"control character in the invocation id": "POST /v1/namespaces/default/runs/a/b/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
			"\r\nX-Stoke-Invocation-ID: a\x01b\r\nContent-Length: 1\r\n\r\n1",
		"bad request line": "NOT A REQUEST\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := rawRequest(t, url, req)
			wantError(t, reply{resp.StatusCode, resp.Header, body}, http.StatusBadRequest, "Stoke.InvalidArgument", true)
		})
	}
	// Headers over net/http's limit are 431, in the same shape.
	resp, body := rawRequest(t, url, "GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", http.DefaultMaxHeaderBytes+8<<10)+"\r\n\r\n")
	wantError(t, reply{resp.StatusCode, resp.Header, body}, http.StatusRequestHeaderFieldsTooLarge, "Stoke.InvalidArgument", true)
}

// A watch ends with an ERROR line when the server stops (its requests'
// base context ends), so that a client re-lists rather than taking the
// end of the stream for the end of the changes.
func TestWatchEndsWithErrorWhenServerStops(t *testing.T) {
	g := gateway.New(gateway.Config{API: plane, Token: token, Logger: quiet})
	srv := httptest.NewUnstartedServer(g)
	stopping, stop := context.WithCancel(context.Background())
	defer stop()
	srv.Config = g.Server()
	srv.Config.BaseContext = func(net.Listener) context.Context { return stopping }
	srv.Start()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/namespaces/default/runs?watch=true&labelSelector=none%3Dhere", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %d", resp.StatusCode)
	}
	stop()
	var last struct {
		Type   string            `json:"type"`
		Object httpapi.ErrorBody `json:"object"`
	}
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		if err := dec.Decode(&last); err != nil {
			t.Fatal(err)
		}
	}
	if last.Type != "ERROR" || last.Object.ErrorType != "Stoke.Unavailable" {
		t.Fatalf("last line %+v, want an ERROR of Stoke.Unavailable", last)
	}
}

// The largest legal Run — its JSON exactly the documented 4 MiB, source and
// arguments at their bounds — is taken and stored; one byte more is 413.
func TestLargestLegalRun(t *testing.T) {
	url := serve(t, gateway.Config{})
	args := make([]string, bounds.Args)
	for i := range args {
		args[i] = strings.Repeat("a", bounds.Arg)
	}
	run := &v1alpha1.Run{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{Name: "largest", Namespace: "default"},
		// Cancelled from the start: the test is about taking and storing
		// it, not running it.
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args}},
			Source:          &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: strings.Repeat("s", bounds.Source)}},
			Env:             []v1alpha1.EnvVar{{Name: "FILL"}},
			CancelRequested: true},
	}
	body := func() string {
		b, err := json.Marshal(run)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	run.Spec.Env[0].Value = strings.Repeat("e", bounds.ObjectBody-len(body()))
	if len(body()) != bounds.ObjectBody {
		t.Fatalf("body is %d bytes", len(body()))
	}
	t.Cleanup(func() {
		for _, name := range []string{"largest", "largest-plus-one", "escaped"} {
			_, _ = plane.DeleteRun(context.Background(), "default", name)
		}
	})
	if r := do(t, http.MethodPost, url+"/v1/namespaces/default/runs", body(), nil); r.status != http.StatusCreated {
		t.Fatalf("create the largest legal Run: %s", r)
	}
	run.Name = "largest-plus-one"
	run.Spec.Env[0].Value += "e"
	wantError(t, do(t, http.MethodPost, url+"/v1/namespaces/default/runs", body(), nil), http.StatusRequestEntityTooLarge, "Stoke.InvalidArgument", false)
	// Within the body bound, but over it once encoded: 413 from validation.
	run.Name = "escaped"
	run.Spec.Env[0].Value = strings.Repeat("<", bounds.ObjectBody/4)
	yamlBody := strings.Replace(runYAML("escaped"), "  mode:", "  env:\n  - name: LT\n    value: \""+run.Spec.Env[0].Value+"\"\n  mode:", 1)
	wantError(t, do(t, http.MethodPost, url+"/v1/namespaces/default/runs", yamlBody, map[string]string{"Content-Type": "application/yaml"}),
		http.StatusRequestEntityTooLarge, "Stoke.InvalidArgument", false)
}

// panickingRouter stands where the control plane's router stands, with a
// bug.
type panickingRouter struct{}

func (panickingRouter) Route(_, _, _ string) (pb.FunctionRuntimeServer, error) {
	panic("a bug")
}

// A handler's panic is a JSON 500, not a dropped connection, and the
// server goes on serving.
func TestPanicIsAJSON500(t *testing.T) {
	url := serve(t, gateway.Config{Router: panickingRouter{}})
	wantError(t, do(t, http.MethodPost, url+"/v1/namespaces/default/runs/f/uid/invoke", `1`, nil), http.StatusInternalServerError, "Stoke.Internal", false)
	if r := do(t, http.MethodGet, url+"/v1/runs", "", nil); r.status != http.StatusOK {
		t.Errorf("after the panic: %s", r)
	}
}
