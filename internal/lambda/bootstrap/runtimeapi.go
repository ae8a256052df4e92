package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/lambda/payload"
)

// The Lambda Runtime API, version 2018-06-01.
const apiVersion = "2018-06-01"

// Headers of the Runtime API.
const (
	headerRequestID = "Lambda-Runtime-Aws-Request-Id"
	headerDeadline  = "Lambda-Runtime-Deadline-Ms"
	headerErrorType = "Lambda-Runtime-Function-Error-Type"
)

// apiClient speaks the Runtime API to AWS_LAMBDA_RUNTIME_API.
type apiClient struct {
	base string
	// hc has no timeout: next blocks until Lambda has an invocation,
	// which may be much later (a frozen sandbox thaws inside the call).
	hc *http.Client
}

func newAPIClient(addr string) *apiClient {
	return &apiClient{
		base: "http://" + addr + "/" + apiVersion + "/runtime",
		hc:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}},
	}
}

// event is one invocation as next hands it over.
type event struct {
	requestID string
	deadline  time.Time
	body      []byte
	received  time.Time // when next answered
}

// next waits for the next invocation.
func (c *apiClient) next(ctx context.Context) (event, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/invocation/next", nil)
	if err != nil {
		return event{}, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return event{}, fmt.Errorf("runtime api next: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, bounds.LambdaPayload+1))
	if err != nil {
		return event{}, fmt.Errorf("runtime api next: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return event{}, fmt.Errorf("runtime api next: %s: %s", resp.Status, bounds.Truncate(string(body), 512))
	}
	ev := event{requestID: resp.Header.Get(headerRequestID), body: body, received: time.Now()}
	if ev.requestID == "" {
		return event{}, fmt.Errorf("runtime api next: no %s header", headerRequestID)
	}
	if len(body) > bounds.LambdaPayload {
		return ev, fmt.Errorf("invocation %s: event larger than %d bytes", ev.requestID, bounds.LambdaPayload)
	}
	if ms, err := strconv.ParseInt(resp.Header.Get(headerDeadline), 10, 64); err == nil && ms > 0 {
		ev.deadline = time.UnixMilli(ms)
	}
	return ev, nil
}

// respond posts an invocation's answer.
func (c *apiClient) respond(ctx context.Context, requestID string, v any) error {
	return c.post(ctx, "/invocation/"+requestID+"/response", "", v)
}

// fail posts an invocation's error.
func (c *apiClient) fail(ctx context.Context, requestID string, e payload.Error) error {
	return c.post(ctx, "/invocation/"+requestID+"/error", e.Type, e)
}

// initError reports that the handler cannot be loaded; Lambda then ends
// the sandbox.
func (c *apiClient) initError(ctx context.Context, e payload.Error) error {
	return c.post(ctx, "/init/error", e.Type, e)
}

func (c *apiClient) post(ctx context.Context, path, errorType string, v any) error {
	// Not json.Marshal: it would escape <, > and & in the handler's
	// output, growing it, perhaps past Lambda's response limit.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("runtime api %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, &buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if errorType != "" {
		req.Header.Set(headerErrorType, errorType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("runtime api %s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("runtime api %s: %s: %s", path, resp.Status, msg)
	}
	return nil
}
