// Package deploy holds the Kubernetes objects a user applies to run Stoke
// on a cluster — the CRDs (crds/, generated), the controller's Namespace,
// ServiceAccount, RBAC and Deployment (controller/), and example Runtimes
// (examples/) — embedded so that the tests apply exactly these files and
// the Helm chart can reuse them.
package deploy

import "embed"

// FS holds every manifest, by its path under deploy/.
//
//go:embed crds/*.yaml controller/*.yaml examples/*.yaml
var FS embed.FS
