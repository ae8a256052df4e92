package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/httpapi"
)

// short are timeouts a test can outlast quickly.
var short = gateway.Timeouts{ReadHeader: 300 * time.Millisecond, Read: 300 * time.Millisecond,
	Write: 300 * time.Millisecond, Idle: 300 * time.Millisecond}

// A slowloris client, trickling its headers over real TCP, is cut off
// after the header timeout however steadily it trickles, and the server
// serves others meanwhile.
func TestSlowClientIsCutOff(t *testing.T) {
	url := serve(t, gateway.Config{Timeouts: short})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan error, 1)
	go func() {
		// The server answers nothing and closes: the read ends.
		_, err := conn.Read(make([]byte, 1))
		cut <- err
	}()
	start := time.Now()
	trickle := time.NewTicker(50 * time.Millisecond)
	defer trickle.Stop()
	for served := false; ; {
		select {
		case err := <-cut:
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("slow client ended with %v, want the server to close", err)
			}
			if !served {
				t.Fatal("cut off before another client was served")
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("cut off after %v", d)
			}
			return
		case <-trickle.C:
			// One more header line, as a slowloris keeps a request alive.
			_, _ = io.WriteString(conn, "X-Slow: 1\r\n")
			if !served {
				if r := do(t, http.MethodGet, url+"/healthz", "", nil); r.status != http.StatusOK {
					t.Fatalf("another client: %s", r)
				}
				served = true
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the slow client was never cut off")
		}
	}
}

// A client that sends its headers and then trickles its body is cut off
// after the read timeout.
func TestSlowBodyIsCutOff(t *testing.T) {
	url := serve(t, gateway.Config{Timeouts: short})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/namespaces/default/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+
		"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	trickle := time.NewTicker(50 * time.Millisecond)
	defer trickle.Stop()
	for {
		select {
		case <-done:
			return // answered (400: the body could not be read) or closed
		case <-trickle.C:
			_, _ = io.WriteString(conn, " ")
		case <-time.After(30 * time.Second):
			t.Fatal("the slow body was never cut off")
		}
	}
}

// A watch outlives the server's read and write timeouts: each write gets
// its own deadline, and the request's context is not cancelled when the
// read deadline passes.
func TestWatchOutlivesTheTimeouts(t *testing.T) {
	url := serve(t, gateway.Config{Timeouts: short})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/namespaces/default/runs?watch=true&labelSelector=watch%3Dlong", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %d", resp.StatusCode)
	}
	// Let every timeout pass with nothing to send; a watch is quiet for
	// as long as nothing changes.
	time.Sleep(4 * short.Write)
	name := "watched-late"
	body := strings.Replace(`{"metadata":{"name":"watched-late","labels":{"watch":"long"}},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, "watched-late", name, 1)
	if r := do(t, http.MethodPost, url+"/v1/namespaces/default/runs", body, nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", name) })
	dec := json.NewDecoder(resp.Body)
	var ev struct {
		Type   string `json:"type"`
		Object struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"object"`
	}
	if err := dec.Decode(&ev); err != nil || ev.Type != "ADDED" || ev.Object.Metadata.Name != name {
		t.Fatalf("event after the timeouts: %+v, %v", ev, err)
	}
}

// deadlineRecorder stands where the function's proxy hop stands: it
// answers at once and records the deadline of the call it got.
type deadlineRecorder struct {
	pb.UnimplementedFunctionRuntimeServer
	deadlines chan time.Time
}

func (d *deadlineRecorder) Route(_, _, _ string) (pb.FunctionRuntimeServer, error) { return d, nil }

func (d *deadlineRecorder) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	d.deadlines <- dl
	return &pb.InvokeFunctionResponse{InvocationId: req.GetInvocationId(), Output: []byte(`1`), ContentType: "application/json"}, nil
}

// The call to the function's pod carries the invocation's own timeout plus
// a margin, or the longest any pod allows when the request sets none.
func TestInvokeCallHasADeadline(t *testing.T) {
	rec := &deadlineRecorder{deadlines: make(chan time.Time, 1)}
	url := serve(t, gateway.Config{API: plane, Router: rec})
	fn := url + "/v1/namespaces/default/runs/f/uid/invoke"
	for _, tt := range []struct {
		header string
		want   time.Duration
	}{
		{"2000", 2 * time.Second},
		{"", bounds.MaxInvokeTimeout},
		{"999999999", bounds.MaxInvokeTimeout},
	} {
		start := time.Now()
		r := do(t, http.MethodPost, fn, `1`, map[string]string{httpapi.HeaderTimeout: tt.header})
		end := time.Now()
		if r.status != http.StatusOK {
			t.Fatalf("invoke: %s", r)
		}
		dl := <-rec.deadlines
		// The margin is the gateway's own: some seconds, under a minute.
		if dl.IsZero() || dl.Before(start.Add(tt.want+time.Second)) || dl.After(end.Add(tt.want+time.Minute)) {
			t.Errorf("timeout %q: deadline %v after the start, want a little over %v", tt.header, dl.Sub(start), tt.want)
		}
	}
}

// An invocation may run longer than the server's write timeout: its answer
// gets the invocation's own time.
func TestLongInvocationOutlivesTheWriteTimeout(t *testing.T) {
	url := serve(t, gateway.Config{Timeouts: short})
	fn := readyFunction(t, url, "long-invocation")
	r := do(t, http.MethodPost, fn, `"slow"`, map[string]string{httpapi.HeaderTimeout: "1000"})
	wantError(t, r, http.StatusGatewayTimeout, "Stoke.DeadlineExceeded", true)
}

// An exec session outlives the server's timeouts: net/http lifts them
// from a hijacked connection.
func TestExecOutlivesTheTimeouts(t *testing.T) {
	base := serve(t, gateway.Config{Exec: plane, Timeouts: short})
	run := execTask(t)
	name := strings.TrimPrefix(run.UID, "default/")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := url.Values{"command": {"bash", "-c", "read line; echo \"got $line\""}, "stdin": {"true"}, "stdout": {"true"}}
	x, err := remotecommand.NewWebSocketExecutor(&rest.Config{Host: base, BearerToken: token}, "GET",
		base+"/v1/namespaces/default/runs/"+name+"/exec?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	// The input comes only after every timeout has passed.
	in, inW := io.Pipe()
	go func() {
		time.Sleep(4 * short.Write)
		_, _ = io.WriteString(inW, "late\n")
		inW.Close()
	}()
	var out bytes.Buffer
	if err := x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: in, Stdout: &out}); err != nil || out.String() != "got late\n" {
		t.Fatalf("exec: %v, stdout %q", err, out.String())
	}
}
