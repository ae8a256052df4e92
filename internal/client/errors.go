package client

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
)

// APIError is an error answer of the server: its status and JSON error body
// (docs/http-api.md, "Errors"). It wraps the errdefs category the status
// stands for or, when a function's handler failed, an
// *errdefs.FunctionError.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Type is the body's errorType: "Stoke.<Code>" for Stoke's own errors,
	// the runtime's type (e.g. "ValueError") for a handler failure.
	Type string
	// Message is the body's errorMessage.
	Message string
	// InvocationID is set on the invoke path.
	InvocationID string
	// StackTrace is a handler failure's trace, when the runtime gave one.
	StackTrace string

	cause error
}

func (e *APIError) Error() string {
	if e.Function() != nil {
		return e.cause.Error()
	}
	return e.Message
}

// Unwrap returns the errdefs category, or the *errdefs.FunctionError.
func (e *APIError) Unwrap() error { return e.cause }

// Function returns the handler failure this error reports, or nil when
// Stoke itself refused or failed the call.
func (e *APIError) Function() *errdefs.FunctionError {
	fe, _ := e.cause.(*errdefs.FunctionError)
	return fe
}

// UnreachableError means no HTTP answer came from the server at all.
type UnreachableError struct {
	Server string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the Stoke server at %s: %v", e.Server, e.Err)
}

// Unwrap returns both the category (errdefs.ErrUnavailable) and the cause.
func (e *UnreachableError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.Err} }

// readError turns a non-2xx answer into an *APIError, reading at most
// MaxErrorBody bytes of its body.
func readError(resp *http.Response) error {
	b, _ := readBounded(resp.Body, MaxErrorBody) // a body over the bound is treated as not JSON
	var body httpapi.ErrorBody
	if err := json.Unmarshal(b, &body); err != nil || (body.ErrorType == "" && body.ErrorMessage == "") {
		// Not Stoke's error shape: a Kubernetes API server's Status (its
		// aggregator's own answers), a proxy in between, or an old
		// server.
		msg := statusLine(resp.StatusCode, b)
		var st struct{ Kind, Message string }
		if json.Unmarshal(b, &st) == nil && st.Kind == "Status" && st.Message != "" {
			msg = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, st.Message)
		}
		body = httpapi.ErrorBody{ErrorMessage: fmt.Sprintf("%s %s: %s", resp.Request.Method, resp.Request.URL.Path, msg)}
	}
	if body.InvocationID == "" {
		body.InvocationID = resp.Header.Get(httpapi.HeaderInvocationID)
	}
	e := &APIError{
		StatusCode: resp.StatusCode, Type: body.ErrorType, Message: body.ErrorMessage,
		InvocationID: body.InvocationID, StackTrace: body.StackTrace,
	}
	if resp.StatusCode == http.StatusInternalServerError && body.ErrorType != "" && !strings.HasPrefix(body.ErrorType, httpapi.ErrorTypePrefix) {
		e.cause = &errdefs.FunctionError{Type: body.ErrorType, Message: body.ErrorMessage, StackTrace: body.StackTrace, InvocationID: body.InvocationID}
	} else {
		e.cause = Category(resp.StatusCode, body.ErrorType)
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// statusLine describes an answer that is not Stoke's JSON error: its status
// and the first line of its body, shortened.
func statusLine(code int, body []byte) string {
	s := fmt.Sprintf("HTTP %d %s", code, http.StatusText(code))
	line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if len(line) > 200 {
		line = line[:200]
		for !utf8.ValidString(line) && len(line) > 0 {
			line = line[:len(line)-1]
		}
		line += "…"
	}
	if line != "" {
		s += ": " + line
	}
	return s
}

// Category is the errdefs category an error answer stands for: errdefs'
// reverse of its one table, from the status and, where one status carries
// two categories (409, 503), the errorType the server wrote ("Stoke." and
// the gRPC code's name, see errdefs.Code); then what other servers on the
// way (a proxy, net/http's own answers) mean by statuses Stoke never writes.
func Category(status int, errorType string) error {
	if cat := errdefs.FromHTTP(status, strings.TrimPrefix(errorType, httpapi.ErrorTypePrefix)); cat != nil {
		return cat
	}
	switch status {
	case http.StatusBadGateway:
		return errdefs.ErrUnavailable
	}
	if status >= 400 && status < 500 {
		return errdefs.ErrInvalidArgument
	}
	return errdefs.ErrInternal
}
