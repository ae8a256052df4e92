package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/randid"
)

func (g *Gateway) invoke(w http.ResponseWriter, r *http.Request) {
	ns, name, uid := r.PathValue("ns"), r.PathValue("name"), r.PathValue("uid")
	g.serveInvoke(w, r, "", func(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, string, error) {
		proxy, err := g.cfg.Router.Route(ns, name, uid)
		if err != nil {
			return nil, "", err
		}
		req.Registration = &pb.FunctionRegistration{RunUid: uid}
		resp, err := proxy.InvokeFunction(ctx, req)
		if err != nil {
			err = hopError(err, "run "+ns+"/"+name)
		}
		return resp, uid, err
	})
}

// invokeFunction is a Function's stable URL: the invocation goes to one
// of its replicas (FunctionInvoker), with the Run route's headers, error
// bodies and statuses.
func (g *Gateway) invokeFunction(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("ns"), r.PathValue("name")
	g.serveInvoke(w, r, "function ", func(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, string, error) {
		return g.cfg.Functions.InvokeFunction(ctx, ns, name, req)
	})
}

// callFunc makes an invocation's one call; it returns the Run UID that
// took it ("" when none did).
type callFunc func(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, string, error)

// serveInvoke is both invoke routes: it reads and checks the request,
// makes the one call, never retried after dispatch, and answers. kind
// ("" for a Run, "function ") and the path's namespace and name name the
// target in the failed invocations' log summary.
func (g *Gateway) serveInvoke(w http.ResponseWriter, r *http.Request, kind string, call callFunc) {
	start := time.Now()
	sw, ok := w.(*statusWriter) // route's: one per request is enough
	if !ok {
		sw = &statusWriter{ResponseWriter: w}
		w = sw
	}
	defer func() { g.cfg.Metrics.observeInvoke(sw.status, time.Since(start)) }()
	invID := r.Header.Get(httpapi.HeaderInvocationID)
	if err := checkInvocationID(invID); err != nil {
		// Not fit to echo; the response still carries an ID of its own.
		writeError(w, err, randid.New("inv_"))
		return
	}
	if invID == "" {
		invID = randid.New("inv_") // so that every response, errors included, carries one
	}
	if err := noQuery(r); err != nil {
		writeError(w, err, invID)
		return
	}
	var timeoutMs int64
	if v := r.Header.Get(httpapi.HeaderTimeout); v != "" {
		d, err := time.ParseDuration(v + "ms")
		if err != nil || d < 0 {
			writeError(w, errdefs.InvalidArgument(httpapi.HeaderTimeout, "must be a non-negative number of milliseconds"), invID)
			return
		}
		timeoutMs = d.Milliseconds()
	}
	body, err := readBody(w, r, bounds.InvokeBody)
	if err != nil {
		writeError(w, err, invID)
		return
	}
	// The call, and the answer to the client, get the invocation's own
	// time plus a margin for the Runtime Server to end it and answer; a
	// Function's queue wait counts against the invocation's own time.
	deadline := time.Now().Add(invokeBound(timeoutMs) + invokeMargin)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(deadline.Add(g.cfg.Timeouts.Write))
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	resp, uid, err := call(ctx, &pb.InvokeFunctionRequest{
		InvocationId: invID, Input: body, ContentType: invokeContentType(r), TimeoutMillis: timeoutMs,
	})
	if err != nil {
		target := kind + r.PathValue("ns") + "/" + r.PathValue("name") // made only for a failure
		g.failed.Record(target, strconv.Itoa(errdefs.HTTPStatus(err)), "invocation "+invID+" of run_uid "+uid+": "+err.Error())
		writeError(w, err, invID)
		return
	}
	h := w.Header()
	h.Set(httpapi.HeaderInvocationID, resp.GetInvocationId())
	h.Set("Content-Type", resp.GetContentType())
	if len(resp.GetOutputs()) > 0 {
		if b, err := json.Marshal(resp.GetOutputs()); err == nil {
			h.Set(httpapi.HeaderOutputs, string(b))
		}
	}
	// The answer goes out now, with its length, rather than when the
	// handler has returned: what runs after it (the deferred cancel, the
	// route's metrics, net/http's own wrappers) is then off the caller's
	// wait, and a large output is not chunked.
	out := resp.GetOutput()
	h.Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	_ = rc.Flush()
	// No logger derived per call: With formats its attributes even when
	// nothing is logged.
	if g.log.Enabled(ctx, slog.LevelDebug) {
		g.log.LogAttrs(ctx, slog.LevelDebug, "invoke", slog.String("run_uid", uid), slog.String("invocation_id", invID),
			slog.Int("status", http.StatusOK), slog.Duration("duration", time.Since(start)))
	}
}

// hopError is the error a proxy hop's call answered, for the caller.
// The transport's own words for Unavailable ("error reading from server:
// EOF", the path of a socket) mean nothing to a caller and are the
// server's, for its log: the pod went away or is restarting its worker,
// and the Run gets another pod, or ends and says so on the next call.
func hopError(err error, target string) error {
	if st, ok := status.FromError(err); ok {
		if st.Code() == codes.Unavailable {
			return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
				"%s: its runtime pod stopped answering (the invocation may have run)", target), NotReadyRetry)
		}
		return errdefs.FromGRPC(err)
	}
	return err
}

// invokeMargin is how much longer than an invocation's own timeout the
// gateway waits for its answer: the Runtime Server kills the handler's
// processes at the timeout and answers 504 itself.
const invokeMargin = 10 * time.Second

// invokeBound is the longest an invocation with this X-Stoke-Timeout-Ms
// may run. Without one the pod's default applies, which the gateway does
// not know; no pod runs one longer than bounds.MaxInvokeTimeout.
func invokeBound(timeoutMs int64) time.Duration {
	if timeoutMs <= 0 {
		return bounds.MaxInvokeTimeout
	}
	return min(time.Duration(timeoutMs)*time.Millisecond, bounds.MaxInvokeTimeout)
}

// errorBodyOf is the error body of err.
func errorBodyOf(err error, invID string) httpapi.ErrorBody {
	var fe *errdefs.FunctionError
	if errors.As(err, &fe) {
		return httpapi.ErrorBody{ErrorType: fe.Type, ErrorMessage: fe.Message, InvocationID: fe.InvocationID, StackTrace: fe.StackTrace}
	}
	// A message may repeat what the client sent: it is cut, so that no
	// answer to a refused request is as large as the request.
	return httpapi.ErrorBody{ErrorType: httpapi.ErrorTypePrefix + errdefs.Code(err).String(), ErrorMessage: bounds.Echo(err.Error()), InvocationID: invID}
}

// writeError is the gateway's one error writer.
func writeError(w http.ResponseWriter, err error, invID string) {
	body := errorBodyOf(err, invID)
	if body.InvocationID != "" {
		w.Header().Set(httpapi.HeaderInvocationID, body.InvocationID)
	}
	if secs, ok := errdefs.RetryAfterSeconds(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(w, errdefs.HTTPStatus(err), body)
}

// checkInvocationID allows at most bounds.InvocationID bytes of visible
// ASCII: the ID is echoed in a header and written to logs, where a
// control character or a space would garble the line.
func checkInvocationID(id string) error {
	if len(id) > bounds.InvocationID {
		return errdefs.InvalidArgument(httpapi.HeaderInvocationID, "is %d bytes, at most %d allowed", len(id), bounds.InvocationID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return errdefs.InvalidArgument(httpapi.HeaderInvocationID, "byte %d is %#02x; only visible ASCII (0x21–0x7e) is allowed", i, c)
		}
	}
	return nil
}

// statusWriter remembers the status written, for metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// invokeContentType is the request's content type for the Runtime Server,
// which takes JSON only: curl's default form encoding is taken as JSON.
func invokeContentType(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" {
		return ct // the usual one, without a parse that allocates
	}
	if mt, _, _ := mime.ParseMediaType(ct); mt == formEncoded {
		return "application/json"
	}
	return ct
}
