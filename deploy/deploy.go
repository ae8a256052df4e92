// Package deploy holds the Kubernetes objects a user applies to run Stoke
// on a cluster — the Helm chart (helm/stoke), the CRDs (crds/, generated;
// the chart's crds/ a copy), and the plain manifests rendered from the
// chart (controller/ and examples/runtimes.yaml, generated) — embedded
// so that the tests install exactly what a user installs.
package deploy

import "embed"

// FS holds every manifest and the chart, by its path under deploy/.
//
//go:embed crds/*.yaml controller/*.yaml examples/*.yaml all:helm/stoke
var FS embed.FS
