package client

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Artifacts are the calls on a WorkflowRun's artifacts, through the
// gateway (`stoke artifacts`).
type Artifacts interface {
	// ListArtifacts lists the artifacts of the WorkflowRun ns/name.
	ListArtifacts(ctx context.Context, ns, workflowRun string) ([]artifact.Artifact, error)
	// OpenArtifact opens one artifact's tar; the caller closes it. Its
	// Artifact has the name, size and digest the server sent.
	OpenArtifact(ctx context.Context, ns, workflowRun, name string) (artifact.Artifact, io.ReadCloser, error)
}

// artifactsPath is the path of a WorkflowRun's artifacts (and of one, with
// a name): the gateway's own, or the aggregated API's.
func (c *Client) artifactsPath(ns, workflowRun string, rest ...string) []string {
	p := []string{"v1", "namespaces", namespaceOf(ns), "workflowruns", workflowRun, "artifacts"}
	if c.aggregated {
		p = append([]string{"apis", "gateway.stoke.dev", "v1alpha1"}, p[1:]...)
	}
	return append(p, rest...)
}

// maxArtifactList bounds the list's answer: bounds.Artifacts manifests of
// well under 1 KiB each.
const maxArtifactList = bounds.Artifacts * 1024

// ListArtifacts implements Artifacts.
func (c *Client) ListArtifacts(ctx context.Context, ns, workflowRun string) ([]artifact.Artifact, error) {
	var out struct {
		Items []artifact.Artifact `json:"items"`
	}
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, c.artifactsPath(ns, workflowRun)...)}, maxArtifactList, &out)
	return out.Items, err
}

// OpenArtifact implements Artifacts.
func (c *Client) OpenArtifact(ctx context.Context, ns, workflowRun, name string) (artifact.Artifact, io.ReadCloser, error) {
	if err := artifact.ValidName(name); err != nil {
		return artifact.Artifact{}, nil, err
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, url: c.url(nil, c.artifactsPath(ns, workflowRun, name)...)})
	if err != nil {
		return artifact.Artifact{}, nil, err
	}
	a := artifact.Artifact{Name: name, WorkflowRun: workflowRun, Namespace: namespaceOf(ns), Digest: resp.Header.Get("X-Stoke-Artifact-Digest")}
	if a.Size, err = strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64); err != nil || a.Digest == "" {
		resp.Body.Close()
		return artifact.Artifact{}, nil, errdefs.Errorf(errdefs.ErrInternal, "artifact %s: the server sent no size or digest", name)
	}
	return a, artifact.Verify(resp.Body, a.Digest, a.Size), nil
}
