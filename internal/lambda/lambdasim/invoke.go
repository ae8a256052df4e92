package lambdasim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"stoke.dev/stoke/internal/bounds"
)

// initTimeout is Lambda's limit on a sandbox's init, which a cold
// invocation gets on top of the function's timeout.
const initTimeout = 10 * time.Second

// tailBytes is how much of an invocation's log LogType Tail returns.
const tailBytes = 4 << 10

func (s *Simulator) invoke(w http.ResponseWriter, r *http.Request) {
	name := nameOf(r.PathValue("name"))
	if s.cfg.BeforeInvoke != nil && refused(w, s.cfg.BeforeInvoke(r.Context(), name)) {
		return
	}
	if t := r.Header.Get("X-Amz-Invocation-Type"); t != "" && t != "RequestResponse" {
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", "the simulator serves only RequestResponse invocations, not "+t)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, bounds.LambdaPayload+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestContentException", err.Error())
		return
	}
	if len(body) > bounds.LambdaPayload {
		writeError(w, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than 6291456 bytes for the InvokeFunction operation")
		return
	}
	if len(body) > 0 && !json.Valid(body) {
		writeError(w, http.StatusBadRequest, "InvalidRequestContentException", "Could not parse request body into json")
		return
	}

	s.mu.Lock()
	fn := s.fns[name]
	switch {
	case fn == nil:
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+arn(name))
		return
	case s.confLocked(fn).State != "Active":
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "ResourceConflictException",
			"The operation cannot be performed at this time. The function is currently in the following state: Pending")
		return
	case s.inflight >= s.cfg.Concurrency:
		s.mu.Unlock()
		w.Header().Set("X-Amzn-ErrorType", "TooManyRequestsException")
		writeJSON(w, http.StatusTooManyRequests, map[string]string{
			"Reason": "ConcurrentInvocationLimitExceeded", "Type": "User", "message": "Rate Exceeded."})
		return
	}
	s.inflight++
	var sb *sandbox
	if n := len(fn.idle); n > 0 {
		sb, fn.idle = fn.idle[n-1], fn.idle[:n-1]
	}
	conf := fn.conf
	zipFile := fn.zip
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()

	requestID := newRequestID()
	timeout := time.Duration(conf.Timeout) * time.Second
	if sb == nil {
		// Lambda bounds init apart from the invocation.
		timeout += initTimeout
		sb, err = s.startSandbox(r.Context(), fn, conf, zipFile)
		if err != nil {
			s.log.Error("starting a sandbox failed", "function", name, "error", err)
			writeError(w, http.StatusInternalServerError, "ServiceException", "starting a sandbox: "+err.Error())
			return
		}
		s.mu.Lock()
		fn.all[sb] = struct{}{}
		s.mu.Unlock()
	}

	mark := sb.logs.mark()
	// As on Lambda, a caller that goes away does not end its invocation.
	res := sb.invoke(context.WithoutCancel(r.Context()), requestID, body, timeout)
	keep := res.keep
	end := Ended{Function: name, Timeout: time.Duration(conf.Timeout) * time.Second}
	if res.functionError {
		var e struct {
			Type string `json:"errorType"`
		}
		_ = json.Unmarshal(res.body, &e)
		end.ErrorType = e.Type
	}
	s.mu.Lock()
	s.ended = append(s.ended, end)
	close(s.endedCh)
	s.endedCh = make(chan struct{})
	if keep && !fn.deleted && !s.closed {
		fn.idle = append(fn.idle, sb)
	} else {
		delete(fn.all, sb)
		keep = false
	}
	s.mu.Unlock()
	if !keep {
		sb.kill()
	}

	w.Header().Set("X-Amzn-Requestid", requestID)
	w.Header().Set("X-Amz-Executed-Version", "$LATEST")
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("X-Amz-Log-Type") == "Tail" {
		// The RIE writes the REPORT line before the answer, but it reaches
		// the simulator through a pipe: wait for it, briefly.
		sb.logs.waitFor(mark, "REPORT RequestId: "+requestID, 200*time.Millisecond)
		w.Header().Set("X-Amz-Log-Result", base64.StdEncoding.EncodeToString(sb.logs.since(mark, tailBytes)))
	}
	if res.functionError {
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(res.body)
}

// result is how one invocation in a sandbox ended.
type result struct {
	body          []byte
	functionError bool
	keep          bool // the sandbox can serve again
}

// invoke runs one invocation through the sandbox's RIE, killing the
// sandbox when the function's timeout passes first.
func (sb *sandbox) invoke(ctx context.Context, requestID string, body []byte, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sb.invokeURL, bytes.NewReader(body))
	if err != nil {
		return errorResult("Sandbox.Failure", err.Error())
	}
	req.Header.Set("X-Amzn-RequestId", requestID)
	start := time.Now()
	resp, err := sb.hc.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return errorResult("Sandbox.Timedout", fmt.Sprintf("%s %s Task timed out after %.2f seconds",
				start.UTC().Format(time.RFC3339), requestID, timeout.Seconds()))
		}
		return errorResult("Sandbox.Failure", "the sandbox did not answer: "+err.Error())
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, bounds.LambdaPayload+1))
	if err != nil {
		return errorResult("Sandbox.Failure", "reading the sandbox's answer: "+err.Error())
	}
	switch {
	case resp.Header.Get("Error-Type") == "Sandbox.Timedout":
		// The RIE's own timeout (the function's, which it counts from
		// the end of init, as Lambda does): the sandbox is discarded.
		return errorResult("Sandbox.Timedout", fmt.Sprintf("%s %s %s", start.UTC().Format(time.RFC3339), requestID, strings.TrimSpace(string(out))))
	case len(out) > bounds.LambdaPayload:
		return result{body: mustJSON(map[string]string{"errorType": "Function.ResponseSizeTooLarge",
			"errorMessage": "Response payload size exceeded maximum allowed payload size (6291556 bytes)."}), functionError: true, keep: true}
	case resp.StatusCode == http.StatusOK:
		return result{body: out, functionError: isErrorDocument(out), keep: true}
	}
	// 502 and the like: init failed or the runtime exited; Lambda
	// discards such a sandbox and initialises a new one next time.
	if !isErrorDocument(out) {
		out = mustJSON(map[string]string{"errorType": "Runtime.ExitError",
			"errorMessage": fmt.Sprintf("RequestId: %s Error: Runtime exited (%s)", requestID, strings.TrimSpace(string(out)))})
	}
	return result{body: out, functionError: true}
}

func errorResult(typ, msg string) result {
	return result{body: mustJSON(map[string]string{"errorType": typ, "errorMessage": msg}), functionError: true}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// isErrorDocument reports whether b is the error shape a runtime posts to
// /error: an object with errorType and errorMessage, and otherwise at most
// stackTrace.
func isErrorDocument(b []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	if _, ok := m["errorType"]; !ok {
		return false
	}
	if _, ok := m["errorMessage"]; !ok {
		return false
	}
	for k := range m {
		if k != "errorType" && k != "errorMessage" && k != "stackTrace" {
			return false
		}
	}
	return true
}
