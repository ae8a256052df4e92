package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

func (g *Gateway) routeObjects() {
	api := g.cfg.API
	runs := func(verb string) func(*http.Request) Access {
		return func(r *http.Request) Access {
			return Access{Verb: verb, Resource: "runs", Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
		}
	}
	runtimes := func(verb string) func(*http.Request) Access {
		return func(r *http.Request) Access {
			return Access{Verb: verb, Resource: "runtimes", Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
		}
	}
	g.route("POST /v1/namespaces/{ns}/runs", "objects", runs("create"), g.createRun)
	g.route("GET /v1/namespaces/{ns}/runs", "objects", runs("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, r.PathValue("ns"), v1alpha1.KindRun, api.ListRuns, api.WatchRuns)
	})
	g.route("GET /v1/runs", "objects", runs("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, "", v1alpha1.KindRun, api.ListRuns, api.WatchRuns)
	})
	g.route("GET /v1/namespaces/{ns}/runs/{name}", "objects", runs("get"), byName(g, http.StatusOK, api.GetRun))
	g.route("PATCH /v1/namespaces/{ns}/runs/{name}", "objects", runs("patch"), g.patchRun)
	g.route("POST /v1/namespaces/{ns}/runs/{name}/cancel", "objects", runs("patch"), byName(g, http.StatusOK, api.CancelRun))
	g.route("DELETE /v1/namespaces/{ns}/runs/{name}", "objects", runs("delete"), byName(g, http.StatusAccepted, api.DeleteRun))

	g.route("PUT /v1/namespaces/{ns}/runtimes/{name}", "objects", runtimes("update"), g.applyRuntime)
	g.route("GET /v1/namespaces/{ns}/runtimes", "objects", runtimes("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, r.PathValue("ns"), v1alpha1.KindRuntime, api.ListRuntimes, api.WatchRuntimes)
	})
	g.route("GET /v1/runtimes", "objects", runtimes("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, "", v1alpha1.KindRuntime, api.ListRuntimes, api.WatchRuntimes)
	})
	g.route("GET /v1/namespaces/{ns}/runtimes/{name}", "objects", runtimes("get"), byName(g, http.StatusOK, api.GetRuntime))
	g.route("DELETE /v1/namespaces/{ns}/runtimes/{name}", "objects", runtimes("delete"), byName(g, http.StatusAccepted, api.DeleteRuntime))

	functions := func(verb string) func(*http.Request) Access {
		return func(r *http.Request) Access {
			return Access{Verb: verb, Resource: "functions", Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
		}
	}
	g.route("POST /v1/namespaces/{ns}/functions", "objects", functions("create"), g.createFunction)
	g.route("PUT /v1/namespaces/{ns}/functions/{name}", "objects", functions("update"), g.applyFunction)
	g.route("GET /v1/namespaces/{ns}/functions", "objects", functions("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, r.PathValue("ns"), v1alpha1.KindFunction, api.ListFunctions, api.WatchFunctions)
	})
	g.route("GET /v1/functions", "objects", functions("list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, "", v1alpha1.KindFunction, api.ListFunctions, api.WatchFunctions)
	})
	g.route("GET /v1/namespaces/{ns}/functions/{name}", "objects", functions("get"), byName(g, http.StatusOK, api.GetFunction))
	g.route("DELETE /v1/namespaces/{ns}/functions/{name}", "objects", functions("delete"), byName(g, http.StatusAccepted, api.DeleteFunction))

	access := func(resource, verb string) func(*http.Request) Access {
		return func(r *http.Request) Access {
			return Access{Verb: verb, Resource: resource, Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
		}
	}
	g.route("POST /v1/namespaces/{ns}/workflowruns", "objects", access("workflowruns", "create"), g.createWorkflowRun)
	g.route("GET /v1/namespaces/{ns}/workflowruns", "objects", access("workflowruns", "list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, r.PathValue("ns"), v1alpha1.KindWorkflowRun, api.ListWorkflowRuns, api.WatchWorkflowRuns)
	})
	g.route("GET /v1/workflowruns", "objects", access("workflowruns", "list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, "", v1alpha1.KindWorkflowRun, api.ListWorkflowRuns, api.WatchWorkflowRuns)
	})
	g.route("GET /v1/namespaces/{ns}/workflowruns/{name}", "objects", access("workflowruns", "get"), byName(g, http.StatusOK, api.GetWorkflowRun))
	g.route("POST /v1/namespaces/{ns}/workflowruns/{name}/cancel", "objects", access("workflowruns", "patch"), byName(g, http.StatusOK, api.CancelWorkflowRun))
	g.route("DELETE /v1/namespaces/{ns}/workflowruns/{name}", "objects", access("workflowruns", "delete"), byName(g, http.StatusAccepted, api.DeleteWorkflowRun))

	g.route("PUT /v1/namespaces/{ns}/workflows/{name}", "objects", access("workflows", "update"), g.applyWorkflow)
	g.route("GET /v1/namespaces/{ns}/workflows", "objects", access("workflows", "list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, r.PathValue("ns"), v1alpha1.KindWorkflow, api.ListWorkflows, api.WatchWorkflows)
	})
	g.route("GET /v1/workflows", "objects", access("workflows", "list"), func(w http.ResponseWriter, r *http.Request) {
		listOrWatch(g, w, r, "", v1alpha1.KindWorkflow, api.ListWorkflows, api.WatchWorkflows)
	})
	g.route("GET /v1/namespaces/{ns}/workflows/{name}", "objects", access("workflows", "get"), byName(g, http.StatusOK, api.GetWorkflow))
	g.route("DELETE /v1/namespaces/{ns}/workflows/{name}", "objects", access("workflows", "delete"), byName(g, http.StatusAccepted, api.DeleteWorkflow))
}

func (g *Gateway) createWorkflowRun(w http.ResponseWriter, r *http.Request) {
	wf := &v1alpha1.WorkflowRun{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, wf)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &wf.Namespace)
	}
	if err == nil && wf.Name == "" && wf.GenerateName != "" {
		wf.Name = wf.GenerateName + randomSuffix()
	}
	if err == nil {
		wf, err = g.cfg.API.CreateWorkflowRun(r.Context(), wf)
	}
	g.reply(w, r, http.StatusCreated, wf, err)
}

func (g *Gateway) applyWorkflow(w http.ResponseWriter, r *http.Request) {
	wf := &v1alpha1.Workflow{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, wf)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &wf.Namespace)
	}
	if err == nil {
		err = nameIn(r.PathValue("name"), &wf.Name)
	}
	if err == nil {
		wf, err = g.cfg.API.ApplyWorkflow(r.Context(), wf)
	}
	g.reply(w, r, http.StatusOK, wf, err)
}

// byName serves a call on one object named in the path: fn's object with
// status, or its error.
func byName[T any](g *Gateway, status int, fn func(ctx context.Context, ns, name string) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var obj T
		err := noQuery(r)
		if err == nil {
			obj, err = fn(r.Context(), r.PathValue("ns"), r.PathValue("name"))
		}
		g.reply(w, r, status, obj, err)
	}
}

// reply writes obj with status, or err; and logs the call.
func (g *Gateway) reply(w http.ResponseWriter, r *http.Request, status int, obj any, err error) {
	if err != nil {
		status = errdefs.HTTPStatus(err)
		g.cfg.Metrics.observeAPI(r.Method, status)
		g.log.Info("api", "method", r.Method, "path", r.URL.Path, "status", status, "error", err)
		writeError(w, err, "")
		return
	}
	g.cfg.Metrics.observeAPI(r.Method, status)
	g.log.Debug("api", "method", r.Method, "path", r.URL.Path, "status", status)
	writeJSON(w, status, obj)
}

// admitBody waits for room among the object bodies the API reads and
// decodes at once — bounds.ObjectBodiesAtOnce bytes, each body counted at
// its Content-Length, or at bounds.ObjectBody when it gives none — so that
// many large bodies at once cost memory in proportion to that bound
// rather than to their number (a YAML body's decoding takes several times
// its size). The others wait, unread; a small body hardly waits. The
// caller calls release once done with the body.
func (g *Gateway) admitBody(r *http.Request) (release func(), err error) {
	n := int64(bounds.ObjectBody)
	if cl := r.ContentLength; cl >= 0 && cl < n {
		n = cl
	}
	if err := g.bodies.Acquire(r.Context(), n); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrCanceled, "the request ended while it waited to be read: %v", err)
	}
	return func() { g.bodies.Release(n) }, nil
}

// readBody reads a request body of at most limit bytes; past it the error
// is ErrTooLarge (413).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if n := r.ContentLength; n > 0 && n <= limit {
		// The server's body ends at Content-Length, within the limit:
		// read into a buffer of exactly that size, where a growing one
		// took bytes.MinRead more and a limiting reader on every call.
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, errdefs.InvalidArgument("body", "%v", err)
		}
		return body, nil
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "request body exceeds %d bytes", limit)
		}
		return nil, errdefs.InvalidArgument("body", "%v", err)
	}
	return body, nil
}

func writeJSON(w http.ResponseWriter, status int, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(obj)
}

// decodeObject reads a JSON or YAML object of at most bounds.ObjectBody
// bytes into obj; unknown fields are refused, so that a misspelt field is
// an error rather than silently ignored.
func (g *Gateway) decodeObject(w http.ResponseWriter, r *http.Request, obj any) error {
	release, err := g.admitBody(r)
	if err != nil {
		return err
	}
	defer release()
	body, err := readBody(w, r, bounds.ObjectBody)
	if err != nil {
		return err
	}
	if err := validation.UTF8("body", body); err != nil {
		return err
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/yaml", "application/x-yaml", "text/yaml":
		// Measured whole, before anything copies it document by document.
		if err := validation.YAMLExpansion("body", body); err != nil {
			return err
		}
		if body, err = oneYAMLDocument(body); err != nil {
			return err
		}
	case "", "application/json", formEncoded:
	default:
		return errdefs.InvalidArgument("Content-Type", "%s is not supported; send application/json or application/yaml", bounds.Quote(mt))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return errdefs.InvalidArgument("body", "not a valid object: %v", err)
	}
	if dec.More() {
		return errdefs.InvalidArgument("body", "holds more than one object")
	}
	return nil
}

// oneYAMLDocument converts a YAML body holding one object to JSON. A body
// of several documents is refused rather than cut to its first: this
// endpoint takes one object, and `stoke apply -f` sends each of a file's
// documents on its own.
func oneYAMLDocument(body []byte) ([]byte, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(body)))
	var doc []byte
	for n := 0; ; {
		next, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errdefs.InvalidArgument("body", "not valid YAML: %v", err)
		}
		if blankYAML(next) {
			continue
		}
		if n++; n > 1 {
			return nil, errdefs.InvalidArgument("body", "holds more than one YAML document; send one object per request (stoke apply -f does)")
		}
		doc = next
	}
	out, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, errdefs.InvalidArgument("body", "not valid YAML: %v", err)
	}
	return out, nil
}

// blankYAML reports whether a YAML document holds only blank and comment
// lines.
func blankYAML(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// formEncoded is what `curl -d` sends when not told otherwise; the API
// reads such a body as JSON, the only thing it could mean here.
const formEncoded = "application/x-www-form-urlencoded"

// placeIn puts an object in the namespace of its URL; a body naming
// another namespace is refused.
func placeIn(ns string, objNS *string) error {
	switch *objNS {
	case "":
		*objNS = ns
	case ns:
	default:
		return errdefs.InvalidArgument("metadata.namespace", "%s does not match the namespace %s of the URL", bounds.Quote(*objNS), bounds.Quote(ns))
	}
	return nil
}

func (g *Gateway) createRun(w http.ResponseWriter, r *http.Request) {
	run := &v1alpha1.Run{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, run)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &run.Namespace)
	}
	if err == nil && run.Name == "" && run.GenerateName != "" {
		run.Name = run.GenerateName + randomSuffix()
	}
	if err == nil {
		run, err = g.cfg.API.CreateRun(r.Context(), run)
	}
	g.reply(w, r, http.StatusCreated, run, err)
}

// patchRun takes a JSON merge patch (RFC 7386), the patch type kubectl
// and Kubernetes clients send with application/merge-patch+json; a plain
// JSON body (curl's) is read as one too.
func (g *Gateway) patchRun(w http.ResponseWriter, r *http.Request) {
	var run *v1alpha1.Run
	var body []byte
	err := noQuery(r)
	if err == nil {
		var release func()
		if release, err = g.admitBody(r); err == nil {
			defer release()
			body, err = readBody(w, r, bounds.ObjectBody)
		}
	}
	if err == nil {
		err = validation.UTF8("body", body)
	}
	if err == nil {
		switch mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt {
		case "application/merge-patch+json", "application/json", "", formEncoded:
		default:
			err = errdefs.InvalidArgument("Content-Type", "%s is not supported; send a JSON merge patch (application/merge-patch+json)", bounds.Quote(mt))
		}
	}
	if err == nil {
		run, err = g.cfg.API.PatchRun(r.Context(), r.PathValue("ns"), r.PathValue("name"), body)
	}
	g.reply(w, r, http.StatusOK, run, err)
}

func (g *Gateway) applyRuntime(w http.ResponseWriter, r *http.Request) {
	rt := &v1alpha1.Runtime{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, rt)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &rt.Namespace)
	}
	if err == nil {
		err = nameIn(r.PathValue("name"), &rt.Name)
	}
	if err == nil {
		rt, err = g.cfg.API.ApplyRuntime(r.Context(), rt)
	}
	g.reply(w, r, http.StatusOK, rt, err)
}

func (g *Gateway) createFunction(w http.ResponseWriter, r *http.Request) {
	fn := &v1alpha1.Function{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, fn)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &fn.Namespace)
	}
	if err == nil {
		fn, err = g.cfg.API.CreateFunction(r.Context(), fn)
	}
	g.reply(w, r, http.StatusCreated, fn, err)
}

func (g *Gateway) applyFunction(w http.ResponseWriter, r *http.Request) {
	fn := &v1alpha1.Function{}
	err := noQuery(r)
	if err == nil {
		err = g.decodeObject(w, r, fn)
	}
	if err == nil {
		err = placeIn(r.PathValue("ns"), &fn.Namespace)
	}
	if err == nil {
		err = nameIn(r.PathValue("name"), &fn.Name)
	}
	if err == nil {
		fn, err = g.cfg.API.ApplyFunction(r.Context(), fn)
	}
	g.reply(w, r, http.StatusOK, fn, err)
}

// nameIn names an object by its URL; a body naming another is refused.
func nameIn(name string, objName *string) error {
	switch *objName {
	case "":
		*objName = name
	case name:
	default:
		return errdefs.InvalidArgument("metadata.name", "%s does not match the name %s of the URL", bounds.Quote(*objName), bounds.Quote(name))
	}
	return nil
}

// randomSuffix is five characters of [a-z0-9], as Kubernetes'
// generateName appends.
func randomSuffix() string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	var b [5]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// list is a RunList or RuntimeList.
type list[T any] struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		ResourceVersion string `json:"resourceVersion,omitempty"`
	} `json:"metadata"`
	Items []T `json:"items"`
}

func listOrWatch[T store.Object](g *Gateway, w http.ResponseWriter, r *http.Request, ns, kind string,
	listFn func(ctx context.Context, opts store.ListOptions) ([]T, string, error),
	watchFn func(ctx context.Context, opts store.WatchOptions) (store.Watcher[T], error)) {
	lq, err := listQueryOf(r, ns, kind)
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	if lq.watch {
		watch(g, w, r, lq, listFn, watchFn)
		return
	}
	items, rv, err := listFn(r.Context(), lq.opts)
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	body := list[T]{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind + "List", Items: items}
	if body.Items == nil {
		body.Items = []T{}
	}
	body.Metadata.ResourceVersion = rv
	g.reply(w, r, http.StatusOK, body, nil)
}
