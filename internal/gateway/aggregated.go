package gateway

import (
	"encoding/json"
	"net/http"
)

// The gateway as a Kubernetes aggregated API (Config.Aggregated): the API
// server serves /apis/gateway.stoke.dev/v1alpha1/... by proxying to the
// gateway once it has authenticated and authorized the caller, so that
// any credential kubectl has reaches invoke, exec and logs. The routes
// are the same handlers as /v1/...; their paths are shaped so that the
// API server's own authorization sees what they do: the subresource
// (invoke, exec, log) right after the Run's name, the invoke route's Run
// UID after it, where the API server reads nothing.
const (
	AggregatedGroup   = "gateway.stoke.dev"
	AggregatedVersion = "v1alpha1"
	// AggregatedPrefix is the path of the aggregated API's group version.
	AggregatedPrefix = "/apis/" + AggregatedGroup + "/" + AggregatedVersion

	aggregatedInvokePath = "POST " + AggregatedPrefix + "/namespaces/{ns}/runs/{name}/invoke/{uid}"
	aggregatedLogPath    = "GET " + AggregatedPrefix + "/namespaces/{ns}/runs/{name}/log"
	aggregatedExecPath   = "GET " + AggregatedPrefix + "/namespaces/{ns}/runs/{name}/exec"
	// A Function's stable URL (functions/invoke).
	aggregatedFunctionInvokePath = "POST " + AggregatedPrefix + "/namespaces/{ns}/functions/{name}/invoke"
)

// routeAggregated adds the aggregated API's routes and its discovery
// documents. Discovery needs only an authenticated caller: the API
// server's availability check and discovery come as
// system:kube-aggregator, and the documents name no Run.
func (g *Gateway) routeAggregated() {
	g.route(aggregatedInvokePath, invokeRoute, runAccess("create", "invoke"), g.invoke)
	if g.cfg.Logs != nil {
		g.route(aggregatedLogPath, "logs", runAccess("get", "log"), g.logs)
	}
	if g.cfg.Exec != nil {
		g.route(aggregatedExecPath, "exec", runAccess("create", "exec"), g.exec)
	}
	if g.cfg.Artifacts != nil {
		g.routeArtifacts(true)
	}
	if g.cfg.Functions != nil {
		g.route(aggregatedFunctionInvokePath, invokeRoute, functionAccess("create", "invoke"), g.invokeFunction)
	}
	authenticated := func(*http.Request) Access { return Access{} }
	// The resource list is empty on purpose: discovery would give the
	// subresources a parent runs.gateway.stoke.dev of its own, a second
	// "runs" beside stoke.dev's for kubectl to choose between.
	g.route("GET "+AggregatedPrefix, "discovery", authenticated, discoveryDocument(map[string]any{
		"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": AggregatedGroup + "/" + AggregatedVersion, "resources": []any{},
	}))
	gv := map[string]any{"groupVersion": AggregatedGroup + "/" + AggregatedVersion, "version": AggregatedVersion}
	g.route("GET /apis/"+AggregatedGroup, "discovery", authenticated, discoveryDocument(map[string]any{
		"kind": "APIGroup", "apiVersion": "v1", "name": AggregatedGroup, "versions": []any{gv}, "preferredVersion": gv,
	}))
}

// discoveryDocument answers with doc as JSON.
func discoveryDocument(doc map[string]any) http.HandlerFunc {
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err) // constant maps of strings
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	}
}
