package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtimeset"
)

func scheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiregistrationv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// Objects decodes every manifest in FS strictly into its typed object.
func objects(t *testing.T) map[string][]runtime.Object {
	t.Helper()
	s := scheme(t)
	out := map[string][]runtime.Object{}
	err := fs.WalkDir(FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "helm" {
				return fs.SkipDir // templates, not objects: Render renders them
			}
			return nil
		}
		data, err := FS.ReadFile(path)
		if err != nil {
			return err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			var tm struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if tm.APIVersion == "" && tm.Kind == "" {
				continue // comments only
			}
			gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
			obj, err := s.New(gvk)
			if err != nil {
				t.Fatalf("%s: %s: %v", path, gvk, err)
			}
			// Strict: an unknown or duplicate field fails, so a typo in a
			// manifest cannot pass as a default.
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s: %s: %v", path, gvk.Kind, err)
			}
			out[path] = append(out[path], obj)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestManifestsDecodeStrictly(t *testing.T) {
	objs := objects(t)
	for _, want := range []string{"crds/stoke.dev_runs.yaml", "crds/stoke.dev_runtimes.yaml", "controller/deployment.yaml", "controller/rbac.yaml", "examples/runtimes.yaml"} {
		if len(objs[want]) == 0 {
			t.Errorf("%s holds no object", want)
		}
	}
	var names []string
	for _, o := range objs["examples/runtimes.yaml"] {
		rt := o.(*v1alpha1.Runtime)
		names = append(names, rt.Name+"/"+rt.Spec.Server)
	}
	if got := strings.Join(names, ","); got != "bash/bash,python/python" {
		t.Errorf("example runtimes %s, want bash and python", got)
	}
}

func TestStrictDecodingRefusesAnUnknownField(t *testing.T) {
	var rt v1alpha1.Runtime
	if err := yaml.UnmarshalStrict([]byte("apiVersion: stoke.dev/v1alpha1\nkind: Runtime\nspec:\n  replica: 2\n"), &rt); err == nil {
		t.Fatal("a misspelt field decoded")
	}
}

// The controller creates runtimed's Role in each Runtime namespace; the
// API server lets it grant only what it holds itself, so its ClusterRole
// must cover every rule of that Role.
func TestControllerRoleCoversRuntimedRole(t *testing.T) {
	var cr *rbacv1.ClusterRole
	for _, o := range objects(t)["controller/rbac.yaml"] {
		if c, ok := o.(*rbacv1.ClusterRole); ok && c.Name == "stoke-controller" {
			cr = c
		}
	}
	if cr == nil {
		t.Fatal("no ClusterRole stoke-controller in controller/rbac.yaml")
	}
	for _, want := range runtimeset.RuntimedRules {
		for _, group := range want.APIGroups {
			for _, res := range want.Resources {
				for _, verb := range want.Verbs {
					covered := slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
						return len(r.ResourceNames) == 0 && slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb)
					})
					if !covered {
						t.Errorf("the controller's ClusterRole does not grant %s %s.%s, which it grants runtimed", verb, res, group)
					}
				}
			}
		}
	}
}
