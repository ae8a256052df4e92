// Package manifest reads the YAML (or JSON) files `stoke apply -f` takes:
// one or more documents separated by "---", each a Run, Runtime,
// Function, WorkflowRun or Workflow of stoke.dev/v1alpha1. Every document is decoded strictly (an unknown or
// repeated field is an error), defaulted and validated, and an error names
// the document by its 1-based index, so a caller can refuse a whole file
// before sending any of it.
package manifest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/runspec"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// Limits of a manifest.
const (
	// MaxFile bounds one manifest file.
	MaxFile = 32 << 20
	// MaxDocument bounds one document: the server takes objects of at most
	// 4 MiB as JSON, which YAML may spell longer.
	MaxDocument = 8 << 20
)

// Object is one document: exactly one of Run, Runtime, Function,
// WorkflowRun and Workflow is set.
type Object struct {
	// Index is the document's 1-based position in its file, counting
	// only documents that hold something.
	Index       int
	Run         *v1alpha1.Run
	Runtime     *v1alpha1.Runtime
	Function    *v1alpha1.Function
	WorkflowRun *v1alpha1.WorkflowRun
	Workflow    *v1alpha1.Workflow
}

// Ref names the object as "run/NAME" or "runtime/NAME" (a Run with only a
// generateName shows it followed by "*").
func (o Object) Ref() string {
	if o.Runtime != nil {
		return "runtime/" + o.Runtime.Name
	}
	if o.Function != nil {
		return "function/" + o.Function.Name
	}
	if o.Workflow != nil {
		return "workflow/" + o.Workflow.Name
	}
	if o.WorkflowRun != nil {
		return refOf(o.WorkflowRun.Name, o.WorkflowRun.GenerateName, "workflowrun")
	}
	if o.Run.Name == "" {
		return "run/" + o.Run.GenerateName + "*"
	}
	return "run/" + o.Run.Name
}

// Parse reads every document of the manifest r (named name in errors)
// and returns them in order. An object without a namespace gets
// namespace. It fails on the first bad document, naming it.
func Parse(r io.Reader, name, namespace string) ([]Object, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(data) > MaxFile {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "%s: exceeds %d bytes", name, MaxFile)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []Object
	seen := map[string]int{}
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, len(objs)+1, err)
		}
		if len(doc) > MaxDocument {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "%s: document %d exceeds %d bytes", name, len(objs)+1, MaxDocument)
		}
		if empty(doc) {
			continue
		}
		idx := len(objs) + 1
		obj, err := decode(doc, namespace)
		if err != nil {
			return nil, docError(name, idx, err)
		}
		obj.Index = idx
		if key := identity(obj); key != "" {
			if prev, dup := seen[key]; dup {
				return nil, errdefs.InvalidArgument(fmt.Sprintf("%s: document %d", name, idx), "%s repeats document %d", obj.Ref(), prev)
			}
			seen[key] = idx
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		return nil, errdefs.InvalidArgument(name, "holds no Run, Runtime, Function, WorkflowRun or Workflow")
	}
	return objs, nil
}

// empty reports whether a document holds only blanks and comments.
func empty(doc []byte) bool {
	for line := range strings.Lines(string(doc)) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

// docError names the document and keeps the error's category; the
// validation package's problems (one per line) become one line.
func docError(name string, idx int, err error) error {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	category := errdefs.ErrInvalidArgument
	if errors.Is(err, errdefs.ErrTooLarge) {
		category = errdefs.ErrTooLarge
	}
	return errdefs.Errorf(category, "%s: document %d: %s", name, idx, msg)
}

func identity(o Object) string {
	switch {
	case o.Runtime != nil:
		return "runtime/" + o.Runtime.Namespace + "/" + o.Runtime.Name
	case o.Function != nil:
		return "function/" + o.Function.Namespace + "/" + o.Function.Name
	case o.Workflow != nil:
		return "workflow/" + o.Workflow.Namespace + "/" + o.Workflow.Name
	case o.WorkflowRun != nil:
		if o.WorkflowRun.Name == "" {
			return ""
		}
		return "workflowrun/" + o.WorkflowRun.Namespace + "/" + o.WorkflowRun.Name
	case o.Run.Name != "":
		return "run/" + o.Run.Namespace + "/" + o.Run.Name
	}
	return ""
}

func decode(doc []byte, namespace string) (Object, error) {
	if err := validation.UTF8("text", doc); err != nil {
		return Object{}, err
	}
	if err := validation.YAMLExpansion("text", doc); err != nil {
		return Object{}, err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return Object{}, fmt.Errorf("not a YAML object: %s", yamlMessage(err))
	}
	switch {
	case tm.Kind == "":
		return Object{}, errors.New("kind is missing: want Run, Runtime, Function, WorkflowRun or Workflow")
	case tm.APIVersion == "":
		return Object{}, fmt.Errorf("apiVersion is missing: want %s", v1alpha1.GroupVersion)
	case tm.APIVersion != v1alpha1.GroupVersion.String():
		return Object{}, fmt.Errorf("apiVersion %q is not served: want %s", tm.APIVersion, v1alpha1.GroupVersion)
	}
	switch tm.Kind {
	case v1alpha1.KindRun:
		run := &v1alpha1.Run{}
		if err := yaml.UnmarshalStrict(doc, run); err != nil {
			return Object{}, fmt.Errorf("bad Run: %s", yamlMessage(err))
		}
		clearServerMeta(&run.ObjectMeta)
		run.Status = v1alpha1.RunStatus{}
		if run.Namespace == "" {
			run.Namespace = namespace
		}
		validation.SetRunDefaults(run)
		if err := runspec.Validate(run); err != nil {
			return Object{}, fmt.Errorf("%s: %w", refOf(run.Name, run.GenerateName, "run"), err)
		}
		return Object{Run: run}, nil
	case v1alpha1.KindRuntime:
		rt := &v1alpha1.Runtime{}
		if err := yaml.UnmarshalStrict(doc, rt); err != nil {
			return Object{}, fmt.Errorf("bad Runtime: %s", yamlMessage(err))
		}
		clearServerMeta(&rt.ObjectMeta)
		rt.Status = v1alpha1.RuntimeStatus{}
		if rt.Namespace == "" {
			rt.Namespace = namespace
		}
		validation.SetRuntimeDefaults(rt)
		if err := validation.ValidateRuntime(rt); err != nil {
			return Object{}, fmt.Errorf("%s: %w", refOf(rt.Name, "", "runtime"), err)
		}
		return Object{Runtime: rt}, nil
	case v1alpha1.KindFunction:
		fn := &v1alpha1.Function{}
		if err := yaml.UnmarshalStrict(doc, fn); err != nil {
			return Object{}, fmt.Errorf("bad Function: %s", yamlMessage(err))
		}
		clearServerMeta(&fn.ObjectMeta)
		fn.Status = v1alpha1.FunctionStatus{}
		if fn.Namespace == "" {
			fn.Namespace = namespace
		}
		validation.SetFunctionDefaults(fn)
		if err := validation.ValidateFunction(fn); err != nil {
			return Object{}, fmt.Errorf("%s: %w", refOf(fn.Name, "", "function"), err)
		}
		return Object{Function: fn}, nil
	case v1alpha1.KindWorkflowRun:
		w := &v1alpha1.WorkflowRun{}
		if err := yaml.UnmarshalStrict(doc, w); err != nil {
			return Object{}, fmt.Errorf("bad WorkflowRun: %s", yamlMessage(err))
		}
		clearServerMeta(&w.ObjectMeta)
		w.Status = v1alpha1.WorkflowRunStatus{}
		if w.Namespace == "" {
			w.Namespace = namespace
		}
		validation.SetWorkflowRunDefaults(w)
		// The Workflows it calls are the server's to look up.
		if err := validation.ValidateWorkflowRun(context.Background(), w, nil); err != nil {
			return Object{}, fmt.Errorf("%s: %w", refOf(w.Name, w.GenerateName, "workflowrun"), err)
		}
		return Object{WorkflowRun: w}, nil
	case v1alpha1.KindWorkflow:
		w := &v1alpha1.Workflow{}
		if err := yaml.UnmarshalStrict(doc, w); err != nil {
			return Object{}, fmt.Errorf("bad Workflow: %s", yamlMessage(err))
		}
		clearServerMeta(&w.ObjectMeta)
		w.Status = v1alpha1.WorkflowStatus{}
		if w.Namespace == "" {
			w.Namespace = namespace
		}
		validation.SetWorkflowDefaults(w)
		if err := validation.ValidateWorkflow(context.Background(), w, nil); err != nil {
			return Object{}, fmt.Errorf("%s: %w", refOf(w.Name, "", "workflow"), err)
		}
		return Object{Workflow: w}, nil
	}
	return Object{}, fmt.Errorf("kind %q is not served: want Run, Runtime, Function, WorkflowRun or Workflow", tm.Kind)
}

// clearServerMeta drops the metadata the server sets, so that the output
// of `stoke get -o yaml` can be applied again.
func clearServerMeta(m *metav1.ObjectMeta) {
	m.UID, m.ResourceVersion, m.Generation = "", "", 0
	m.CreationTimestamp, m.DeletionTimestamp, m.DeletionGracePeriodSeconds = metav1.Time{}, nil, nil
	m.ManagedFields = nil
}

func refOf(name, generateName, kind string) string {
	if name == "" && generateName != "" {
		return kind + "/" + generateName + "*"
	}
	return kind + "/" + name
}

// yamlMessage drops sigs.k8s.io/yaml's wrapping ("error converting YAML
// to JSON: ", "error unmarshaling JSON: while decoding JSON: json: ").
func yamlMessage(err error) string {
	msg := err.Error()
	for _, p := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}
