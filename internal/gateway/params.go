package gateway

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/labels"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// Each route reads its query parameters here, in one function of its own,
// and refuses with 400 and a message naming the parameter one it does
// not take, one given twice, a malformed query and a value it cannot
// read — as the Kubernetes API server does — rather than taking any of
// them for a default.

// params names the query parameters of a route; true marks one that may
// be given more than once.
type params map[string]bool

var (
	noParams   = params{}
	runList    = params{"labelSelector": false, "phase": false, "limit": false, "watch": false, "resourceVersion": false}
	objectList = params{"labelSelector": false, "limit": false, "watch": false, "resourceVersion": false}
	logParams  = params{"follow": false}
	execParams = params{"command": true, "stdin": false, "stdout": false, "stderr": false, "tty": false, "container": false, "attach": false, "stdinOnce": false}
)

// queryOf parses r's query string for its route, which takes ps.
func queryOf(r *http.Request, ps params) (url.Values, error) {
	route := r.Pattern
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, errdefs.InvalidArgument("query", "%s", bounds.Truncate(err.Error(), bounds.Quoted))
	}
	for name, vs := range q {
		repeatable, ok := ps[name]
		switch {
		case !ok && len(ps) == 0:
			return nil, errdefs.InvalidArgument(bounds.Truncate(name, bounds.Quoted), "is not a query parameter of %s, which takes none", route)
		case !ok:
			return nil, errdefs.InvalidArgument(bounds.Truncate(name, bounds.Quoted), "is not a query parameter of %s, which takes %s", route, strings.Join(slices.Sorted(maps.Keys(ps)), ", "))
		case len(vs) > 1 && !repeatable:
			return nil, errdefs.InvalidArgument(name, "is given %d times; give it once", len(vs))
		}
	}
	return q, nil
}

// noQuery refuses any query parameter on a route that takes none.
func noQuery(r *http.Request) error {
	if r.URL.RawQuery == "" {
		return nil // nothing to parse, and no map made for it
	}
	_, err := queryOf(r, noParams)
	return err
}

// boolParam reads a boolean parameter as strconv.ParseBool does (true,
// false, 1, 0, t, f); absent is false.
func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidArgument(name, "%s is not a boolean (true or false)", bounds.Quote(v))
	}
	return b, nil
}

// listQuery is what a list or a watch was asked for.
type listQuery struct {
	opts  store.ListOptions
	watch bool
	// resourceVersion starts a watch after it; a list is always of the
	// latest version, which is never older than one asked for.
	resourceVersion string
}

// listQueryOf reads a list's or a watch's parameters: labelSelector,
// phase (Runs only), limit (a count of at least 0; the list is never
// cut into pages, as the Kubernetes API server may also answer), watch
// and resourceVersion.
func listQueryOf(r *http.Request, ns, kind string) (listQuery, error) {
	ps := objectList
	if kind == v1alpha1.KindRun {
		ps = runList
	}
	lq := listQuery{opts: store.ListOptions{Namespace: ns}}
	q, err := queryOf(r, ps)
	if err != nil {
		return lq, err
	}
	if s := q.Get("labelSelector"); s != "" {
		if lq.opts.LabelSelector, err = labelSelector(s); err != nil {
			return lq, err
		}
	}
	if p, ok := q["phase"]; ok {
		if lq.opts.Phases, err = phases(p[0]); err != nil {
			return lq, err
		}
	}
	if l, ok := q["limit"]; ok {
		if n, err := strconv.ParseInt(l[0], 10, 64); err != nil || n < 0 {
			return lq, errdefs.InvalidArgument("limit", "%s is not a count of at least 0", bounds.Quote(l[0]))
		}
	}
	if lq.watch, err = boolParam(q, "watch"); err != nil {
		return lq, err
	}
	lq.resourceVersion = q.Get("resourceVersion")
	return lq, nil
}

// labelSelector parses a Kubernetes label selector. Its lexer takes a NUL
// for the end of the text, so that "%00" would select everything: control
// characters (which no label holds) are refused first.
func labelSelector(s string) (labels.Selector, error) {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return nil, errdefs.InvalidArgument("labelSelector", "%s holds a control character or is not UTF-8", bounds.Quote(s))
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, errdefs.InvalidArgument("labelSelector", "%s", bounds.Truncate(err.Error(), bounds.Message))
	}
	return sel, nil
}

// phases reads "A,B": each a Run phase.
func phases(s string) ([]v1alpha1.Phase, error) {
	var out []v1alpha1.Phase
	for _, p := range strings.Split(s, ",") {
		ph := v1alpha1.Phase(p)
		if !slices.Contains(allPhases, ph) {
			names := make([]string, len(allPhases))
			for i, p := range allPhases {
				names[i] = string(p)
			}
			return nil, errdefs.InvalidArgument("phase", "%s is not a phase; phases are %s, separated by commas", bounds.Quote(p), strings.Join(names, ", "))
		}
		out = append(out, ph)
		if ph == v1alpha1.PhasePending {
			// A Run the scheduler has not looked at yet has no phase
			// written; it is Pending all the same.
			out = append(out, "")
		}
	}
	return out, nil
}

// logsQueryOf reads a log request's one parameter, follow.
func logsQueryOf(r *http.Request) (follow bool, err error) {
	q, err := queryOf(r, logParams)
	if err != nil {
		return false, err
	}
	return boolParam(q, "follow")
}
