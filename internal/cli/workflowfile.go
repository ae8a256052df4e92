package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/manifest"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/wfconvert"
)

// WorkflowFileOptions say how `stoke workflow run` makes its WorkflowRun.
type WorkflowFileOptions struct {
	Namespace string
	// Set are the inputs (--set NAME=VALUE).
	Set map[string]string
	// RunsOn maps a GitHub Actions file's runs-on labels to Runtimes;
	// RunsOnDefault is the Runtime of any other label.
	RunsOn        map[string]string
	RunsOnDefault string
}

// LoadWorkflow makes the WorkflowRun `stoke workflow run` creates: from
// file (a GitHub Actions workflow file, converted by internal/wfconvert,
// or a WorkflowRun manifest; "-" reads in), or, with no file, one that
// runs the Workflow args[0]. --set gives its inputs either way.
func LoadWorkflow(file string, args []string, in io.Reader, o WorkflowFileOptions) (*v1alpha1.WorkflowRun, error) {
	var wf *v1alpha1.WorkflowRun
	if file == "" {
		name := args[0]
		wf = &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}, Spec: v1alpha1.WorkflowRunSpec{Workflow: name}}
	} else {
		data, err := readWorkflowFile(file, in)
		if err != nil {
			return nil, err
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(data, &head); err == nil && head.APIVersion == v1alpha1.GroupVersion.String() {
			if head.Kind != v1alpha1.KindWorkflowRun {
				return nil, errdefs.InvalidArgument(file, "is a %s; stoke workflow run takes a WorkflowRun or a GitHub Actions workflow (stoke apply takes the rest)", head.Kind)
			}
			wf = &v1alpha1.WorkflowRun{}
			if err := yaml.UnmarshalStrict(data, wf); err != nil {
				return nil, errdefs.InvalidArgument(file, "%v", err)
			}
		} else {
			wf, err = wfconvert.Convert(data, wfconvert.Options{RunsOn: o.RunsOn, DefaultRuntime: o.RunsOnDefault})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if wf.Name == "" && wf.GenerateName == "" {
				wf.GenerateName = fileSlug(file) + "-"
			}
		}
	}
	if wf.Namespace == "" {
		wf.Namespace = o.Namespace
	}
	if len(o.Set) > 0 && wf.Spec.Workflow == "" {
		return nil, errdefs.InvalidArgument("--set", "gives a Workflow's inputs; this WorkflowRun runs jobs of its own (use env: in the file)")
	}
	for _, k := range sortedKeys(o.Set) {
		i := slices.IndexFunc(wf.Spec.Inputs, func(nv v1alpha1.NameValue) bool { return nv.Name == k })
		if i >= 0 {
			wf.Spec.Inputs[i].Value = o.Set[k]
		} else {
			wf.Spec.Inputs = append(wf.Spec.Inputs, v1alpha1.NameValue{Name: k, Value: o.Set[k]})
		}
	}
	return wf, nil
}

func readWorkflowFile(file string, in io.Reader) ([]byte, error) {
	r := in
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, manifest.MaxDocument+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(data) > manifest.MaxDocument {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "%s: exceeds %d bytes", file, manifest.MaxDocument)
	}
	return data, nil
}

// fileSlug is a file's base name as the start of a DNS-1123 name.
func fileSlug(file string) string {
	base := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	var b strings.Builder
	for _, r := range strings.ToLower(base) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > 40 {
		s = strings.Trim(s[:40], "-")
	}
	if s == "" || file == "-" {
		s = "workflow"
	}
	return s
}

// ParseAssignments reads NAME=VALUE flags into a map; a name given twice
// is an error.
func ParseAssignments(flag string, list []string) (map[string]string, error) {
	out := map[string]string{}
	for _, a := range list {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, errdefs.InvalidArgument(flag, "%q is not NAME=VALUE", a)
		}
		if _, dup := out[k]; dup {
			return nil, errdefs.InvalidArgument(flag, "%s is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
