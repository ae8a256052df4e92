package gateway

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"stoke.dev/stoke/internal/artifact"
)

// Artifacts are a WorkflowRun's artifacts, by its name (artifact.Reader):
// `stoke artifacts ls|get`.
type Artifacts interface {
	ListArtifacts(ctx context.Context, namespace, workflowRun string) ([]artifact.Artifact, error)
	OpenArtifact(ctx context.Context, namespace, workflowRun, name string) (artifact.Artifact, io.ReadCloser, error)
}

// The artifact routes: a list (JSON) and one artifact's tar. Through the
// aggregated API the subresource comes right after the WorkflowRun's name,
// so that the API server authorizes `get` on `workflowruns/artifacts`, as
// the gateway does again.
const (
	artifactsPath           = "GET /v1/namespaces/{ns}/workflowruns/{name}/artifacts"
	artifactPath            = "GET /v1/namespaces/{ns}/workflowruns/{name}/artifacts/{artifact}"
	aggregatedArtifactsPath = "GET " + AggregatedPrefix + "/namespaces/{ns}/workflowruns/{name}/artifacts"
	aggregatedArtifactPath  = "GET " + AggregatedPrefix + "/namespaces/{ns}/workflowruns/{name}/artifacts/{artifact}"
)

// ArtifactList is the list route's answer.
type ArtifactList struct {
	Items []artifact.Artifact `json:"items"`
}

func workflowRunAccess(verb, subresource string) func(*http.Request) Access {
	return func(r *http.Request) Access {
		return Access{Verb: verb, Resource: "workflowruns", Subresource: subresource, Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
	}
}

func (g *Gateway) routeArtifacts(aggregated bool) {
	list, one := artifactsPath, artifactPath
	if aggregated {
		list, one = aggregatedArtifactsPath, aggregatedArtifactPath
	}
	g.route(list, "artifacts", workflowRunAccess("get", "artifacts"), g.listArtifacts)
	g.route(one, "artifacts", workflowRunAccess("get", "artifacts"), g.getArtifact)
}

func (g *Gateway) listArtifacts(w http.ResponseWriter, r *http.Request) {
	items, err := g.cfg.Artifacts.ListArtifacts(r.Context(), r.PathValue("ns"), r.PathValue("name"))
	if err != nil {
		writeError(w, err, "")
		return
	}
	if items == nil {
		items = []artifact.Artifact{}
	}
	writeJSON(w, http.StatusOK, ArtifactList{Items: items})
}

// getArtifact streams the artifact's tar; its digest and size are in the
// headers before it. The bytes are checked against the digest as they go:
// a damaged blob ends the answer short, which the client's own check of
// the digest (and tar's end marker) sees.
func (g *Gateway) getArtifact(w http.ResponseWriter, r *http.Request) {
	a, rc, err := g.cfg.Artifacts.OpenArtifact(r.Context(), r.PathValue("ns"), r.PathValue("name"), r.PathValue("artifact"))
	if err != nil {
		writeError(w, err, "")
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Length", strconv.FormatInt(a.Size, 10))
	w.Header().Set(ArtifactDigestHeader, a.Digest)
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		g.log.Warn("artifact read ended early", "namespace", r.PathValue("ns"), "workflowrun", r.PathValue("name"), "artifact", a.Name, "error", err)
	}
}

// ArtifactDigestHeader carries an artifact's digest ("sha256:<hex>").
const ArtifactDigestHeader = "X-Stoke-Artifact-Digest"
