package standalone_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/httpapi"
)

const testToken = "s3cret-token"

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, token, body string, header map[string]string) reply {
	t.Helper()
	r, err := postErr(url, token, body, header)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// postErr is post for a goroutine other than the test's, which must not
// call t.Fatal.
func postErr(url, token, body string, header map[string]string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}, nil
}

// The invoke path through a real HTTP gateway: one status per row of the
// docs/http-api.md table, each response with an invocation ID, and nothing
// invoked when a request is refused.
func TestGatewayInvoke(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 4))
	ctx := context.Background()
	src := `import time
calls = 0

def handle(event, context):
    global calls
    calls += 1
    if event == "boom":
        raise ValueError("it broke")
    if event == "slow":
        time.sleep(1.5)
    context.set_output("calls", str(calls))
    return {"calls": calls, "event": event}
`
	created, err := p.CreateRun(ctx, pyFunction("gw", src))
	if err != nil {
		t.Fatal(err)
	}
	p.waitRun(t, "gw", "Ready", phaseIs(v1alpha1.PhaseReady))
	srv := httptest.NewServer(gateway.New(gateway.Config{Router: p, Token: testToken}))
	defer srv.Close()
	url := srv.URL + "/v1/namespaces/default/runs/gw/" + string(created.UID) + "/invoke"

	refused := []struct {
		name   string
		url    string
		token  string
		body   string
		header map[string]string
		status int
	}{
		{"no token", url, "", `1`, nil, http.StatusUnauthorized},
		{"wrong token", url, "wrong", `1`, nil, http.StatusUnauthorized},
		{"wrong uid", srv.URL + "/v1/namespaces/default/runs/gw/not-the-uid/invoke", testToken, `1`, nil, http.StatusNotFound},
		{"wrong name", srv.URL + "/v1/namespaces/default/runs/other/" + string(created.UID) + "/invoke", testToken, `1`, nil, http.StatusNotFound},
		{"body over the bound", url, testToken, `"` + strings.Repeat("x", bounds.InvokeBody) + `"`, nil, http.StatusRequestEntityTooLarge},
		{"invocation id over the bound", url, testToken, `1`, map[string]string{httpapi.HeaderInvocationID: strings.Repeat("i", bounds.InvocationID+1)}, http.StatusBadRequest},
		{"not JSON", url, testToken, `{nope`, nil, http.StatusBadRequest},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, tt.url, tt.token, tt.body, tt.header)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if tt.status != http.StatusUnauthorized && r.header.Get(httpapi.HeaderInvocationID) == "" {
				t.Fatal("no invocation ID on the response")
			}
		})
	}
	// Nothing above reached the handler: the first real call is call 1.
	r := post(t, url, testToken, `"hello"`, map[string]string{httpapi.HeaderInvocationID: "inv-123"})
	if r.status != http.StatusOK || r.header.Get(httpapi.HeaderInvocationID) != "inv-123" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("invoke: %d %v %s", r.status, r.header, r.body)
	}
	var out struct {
		Calls int    `json:"calls"`
		Event string `json:"event"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || out.Calls != 1 || out.Event != "hello" {
		t.Fatalf("body %s (%v): refused requests reached the handler", r.body, err)
	}
	if r.header.Get(httpapi.HeaderOutputs) != `{"calls":"1"}` {
		t.Fatalf("outputs header %q", r.header.Get(httpapi.HeaderOutputs))
	}

	// A handler failure: 500 with Lambda's error shape.
	r = post(t, url, testToken, `"boom"`, nil)
	var fe struct{ ErrorType, ErrorMessage, InvocationID, StackTrace string }
	if err := json.Unmarshal(r.body, &fe); err != nil || r.status != http.StatusInternalServerError ||
		fe.ErrorType != "ValueError" || fe.ErrorMessage != "it broke" || fe.InvocationID == "" || !strings.Contains(fe.StackTrace, "ValueError") {
		t.Fatalf("function error: %d %s", r.status, r.body)
	}

	// One in flight: a concurrent call gets 429 at once.
	var wg sync.WaitGroup
	wg.Add(1)
	slow := make(chan reply, 1)
	slowErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		r, err := postErr(url, testToken, `"slow"`, nil)
		slow <- r
		slowErr <- err
	}()
	waitInFlight(t, p, created.UID)
	if r := post(t, url, testToken, `1`, nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("concurrent call: %d %s", r.status, r.body)
	}
	wg.Wait()
	if err := <-slowErr; err != nil {
		t.Fatalf("slow call: %v", err)
	}
	if r := <-slow; r.status != http.StatusOK {
		t.Fatalf("slow call: %d %s", r.status, r.body)
	}

	// A Run that is no longer Ready: 503.
	if _, err := p.CancelRun(ctx, "default", "gw"); err != nil {
		t.Fatal(err)
	}
	p.waitRun(t, "gw", "Cancelled", phaseIs(v1alpha1.PhaseCancelled))
	// Routes come from the informer's memory, which may trail the store by
	// an event: until it catches up the owner answers that it has no
	// registration (404). Never 200, and 503 once the route sees the Run is
	// no longer Ready.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r := post(t, url, testToken, `1`, nil)
		if r.status == http.StatusServiceUnavailable {
			break
		}
		if r.status != http.StatusNotFound || time.Now().After(deadline) {
			t.Fatalf("after cancel: %d %s", r.status, r.body)
		}
	}
}

// waitInFlight waits until the function reports an invocation in flight.
func waitInFlight(t *testing.T, p *plane, uid types.UID) {
	t.Helper()
	run, err := p.GetRun(context.Background(), "default", "gw")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := p.FunctionProxy(run)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := proxy.FunctionStatus(context.Background(), &pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: string(uid)}})
		if err == nil && st.GetInFlight() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no invocation in flight: %v %v", st, err)
		}
		time.Sleep(2 * time.Millisecond) // polling an observable state
	}
}

// Open watches and followed logs are bounded: past the bound a new one is
// refused with 429 at once, and a closed one frees its slot.
func TestGatewayBoundsOpenStreams(t *testing.T) {
	p := start(t, runtimeOf("bash", 1, 2))
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Token: testToken, MaxStreams: 2}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	open := func() (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/namespaces/default/runs?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := client.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		return resp, cancel
	}
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i := range 2 {
		resp, cancel := open()
		cancels = append(cancels, cancel)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("watch %d: %d", i, resp.StatusCode)
		}
		defer resp.Body.Close()
	}
	resp, cancel := open()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "Stoke.ResourceExhausted") {
		t.Fatalf("third watch: %d %s; want 429", resp.StatusCode, b)
	}
	// Closing one frees its slot once the server has seen it go; the next
	// watch waits for that rather than racing it.
	cancels[0]()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, cancel := open()
		status := resp.StatusCode
		resp.Body.Close()
		cancel()
		if status == http.StatusOK {
			break
		}
		if status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("watch after one closed: %d", status)
		}
	}
}
