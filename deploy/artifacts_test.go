package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// deploymentContainers renders the chart with values and returns its
// Deployments by name.
func deploymentContainers(t *testing.T, values map[string]any) map[string]*appsv1.Deployment {
	t.Helper()
	ms, err := Render("stoke-system", values)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*appsv1.Deployment{}
	for _, m := range ms {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(m.Content), &head); err != nil {
			t.Fatalf("%s: %v", m.Template, err)
		}
		if head.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(m.Content), &d); err != nil {
			t.Fatalf("%s: %v", m.Template, err)
		}
		out[d.Name] = &d
	}
	return out
}

// artifacts.s3 becomes the same --artifact-s3-* flags on the controller
// (which writes the store) and the gateway (which serves `stoke
// artifacts`), its credentialsSecret both's environment (never an
// argument), artifacts.retention the controller's --artifact-retention;
// by default neither has any of them.
func TestChartArtifactStore(t *testing.T) {
	for name, d := range deploymentContainers(t, map[string]any{}) {
		c := d.Spec.Template.Spec.Containers[0]
		for _, a := range c.Args {
			if len(a) > 11 && a[:11] == "--artifact-" {
				t.Errorf("by default %s has %s", name, a)
			}
		}
		if len(c.EnvFrom) > 0 {
			t.Errorf("by default %s has envFrom %v", name, c.EnvFrom)
		}
	}
	ds := deploymentContainers(t, map[string]any{"artifacts": map[string]any{
		"s3":        map[string]any{"bucket": "ci", "endpoint": "http://minio.minio:9000", "region": "eu-west-1", "pathStyle": true, "prefix": "x/", "credentialsSecret": "s3-creds"},
		"retention": "48h",
	}})
	s3 := []string{"--artifact-s3-bucket=ci", "--artifact-s3-prefix=x/", "--artifact-s3-endpoint=http://minio.minio:9000", "--artifact-s3-region=eu-west-1", "--artifact-s3-path-style"}
	for name, extra := range map[string][]string{"stoke-controller": {"--artifact-retention=48h"}, "stoke-gateway": nil} {
		d := ds[name]
		if d == nil {
			t.Fatalf("no Deployment %s", name)
		}
		c := d.Spec.Template.Spec.Containers[0]
		for _, want := range append(slices.Clone(s3), extra...) {
			if !slices.Contains(c.Args, want) {
				t.Errorf("%s lacks %s: %q", name, want, c.Args)
			}
		}
		if name == "stoke-gateway" && slices.Contains(c.Args, "--artifact-retention=48h") {
			t.Errorf("the gateway, which sweeps nothing, has --artifact-retention")
		}
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "s3-creds" {
			t.Errorf("%s's envFrom is %v, want the Secret s3-creds", name, c.EnvFrom)
		}
	}
	if _, err := Render("stoke-system", map[string]any{"artifacts": map[string]any{"s3": map[string]any{"bucket": "ci", "pathStyle": "yes"}}}); err == nil {
		t.Error("a string for artifacts.s3.pathStyle was accepted")
	}
	if _, err := Render("stoke-system", map[string]any{"artifacts": map[string]any{"retention": "two days"}}); err == nil {
		t.Error("artifacts.retention \"two days\" was accepted")
	}
}
