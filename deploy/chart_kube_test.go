package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/kubetest"
)

// Every object the chart renders, with its defaults and with other value
// sets, is accepted by a real API server (server-side dry run: schema,
// CRD and admission checks, nothing stored), in a namespace of the test's.
func TestChartObjectsPassServerSideDryRun(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string // kinds/names the rendering must hold
	}{
		{"defaults", nil, []string{"deployment.apps/stoke-controller", "deployment.apps/stoke-gateway", "runtime.stoke.dev/python", "networkpolicy.networking.k8s.io/stoke-runtime", "clusterrole.rbac.authorization.k8s.io/stoke-edit"}},
		{"generated gateway certificate", map[string]any{"gateway": map[string]any{"tls": map[string]any{"generate": true}}}, []string{"secret/stoke-gateway-serving"}},
		{"own gateway certificate and image tag and more replicas", map[string]any{
			"image":      map[string]any{"repository": "registry.example/stoke", "tag": "v1"},
			"gateway":    map[string]any{"replicas": 3, "tls": map[string]any{"secretName": "my-tls"}},
			"controller": map[string]any{"replicas": 3},
		}, []string{"deployment.apps/stoke-gateway"}},
		{"no gateway or runtimes or network policy", map[string]any{
			"gateway":       map[string]any{"enabled": false},
			"runtimes":      map[string]any{"install": false},
			"networkPolicy": map[string]any{"enabled": false},
		}, []string{"deployment.apps/stoke-controller"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := map[string]any{"runtimes": map[string]any{"namespace": ns}}
			for k, v := range tc.values {
				if k == "runtimes" {
					v.(map[string]any)["namespace"] = ns
				}
				values[k] = v
			}
			ms, err := Render(ns, values)
			if err != nil {
				t.Fatal(err)
			}
			var docs []string
			for _, m := range ms {
				docs = append(docs, m.Content)
			}
			file := filepath.Join(t.TempDir(), "stoke.yaml")
			if err := os.WriteFile(file, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
				t.Fatal(err)
			}
			out := c.Kubectl(t, "apply", "--dry-run=server", "-f", file)
			for _, w := range tc.want {
				if !strings.Contains(out, w+" created (server dry run)") {
					t.Errorf("the dry run did not create %s:\n%s", w, out)
				}
			}
		})
	}
}
