package kube

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// kind is what the generic code needs to know about one custom resource.
type kind[T store.Object] struct {
	name     string // Kind
	noun     string // lower case, for messages
	resource string // the API's plural resource name
	new      func() T
	newList  func() runtime.Object
	items    func(list runtime.Object) []T
	// hasPhase says whether ListOptions.Phases applies; hasPod whether
	// the AssignedPodUID filters do.
	hasPhase, hasPod bool
	phase            func(T) v1alpha1.Phase
}

var runKind = &kind[*v1alpha1.Run]{
	name:     v1alpha1.KindRun,
	noun:     "run",
	resource: "runs",
	new:      func() *v1alpha1.Run { return new(v1alpha1.Run) },
	newList:  func() runtime.Object { return new(v1alpha1.RunList) },
	items: func(list runtime.Object) []*v1alpha1.Run {
		l := list.(*v1alpha1.RunList)
		out := make([]*v1alpha1.Run, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	},
	hasPhase: true,
	hasPod:   true,
	phase:    func(r *v1alpha1.Run) v1alpha1.Phase { return r.Status.Phase },
}

var runtimeKind = &kind[*v1alpha1.Runtime]{
	name:     v1alpha1.KindRuntime,
	noun:     "runtime",
	resource: "runtimes",
	new:      func() *v1alpha1.Runtime { return new(v1alpha1.Runtime) },
	newList:  func() runtime.Object { return new(v1alpha1.RuntimeList) },
	items: func(list runtime.Object) []*v1alpha1.Runtime {
		l := list.(*v1alpha1.RuntimeList)
		out := make([]*v1alpha1.Runtime, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	},
}

var functionKind = &kind[*v1alpha1.Function]{
	name:     v1alpha1.KindFunction,
	noun:     "function",
	resource: "functions",
	new:      func() *v1alpha1.Function { return new(v1alpha1.Function) },
	newList:  func() runtime.Object { return new(v1alpha1.FunctionList) },
	items: func(list runtime.Object) []*v1alpha1.Function {
		l := list.(*v1alpha1.FunctionList)
		out := make([]*v1alpha1.Function, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	},
}

var workflowRunKind = &kind[*v1alpha1.WorkflowRun]{
	name:     v1alpha1.KindWorkflowRun,
	noun:     "workflowrun",
	resource: "workflowruns",
	new:      func() *v1alpha1.WorkflowRun { return new(v1alpha1.WorkflowRun) },
	newList:  func() runtime.Object { return new(v1alpha1.WorkflowRunList) },
	items: func(list runtime.Object) []*v1alpha1.WorkflowRun {
		l := list.(*v1alpha1.WorkflowRunList)
		out := make([]*v1alpha1.WorkflowRun, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	},
}

var workflowKind = &kind[*v1alpha1.Workflow]{
	name:     v1alpha1.KindWorkflow,
	noun:     "workflow",
	resource: "workflows",
	new:      func() *v1alpha1.Workflow { return new(v1alpha1.Workflow) },
	newList:  func() runtime.Object { return new(v1alpha1.WorkflowList) },
	items: func(list runtime.Object) []*v1alpha1.Workflow {
		l := list.(*v1alpha1.WorkflowList)
		out := make([]*v1alpha1.Workflow, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	},
}

// Field selectors of the Run CRD's selectableFields.
const (
	fieldPhase          = "status.phase"
	fieldAssignedPodUID = "status.assignedPodUID"
	fieldPlacedPodUID   = "spec.placement.podUID"
)

// knownPhases is every value status.phase takes, "" (not written yet)
// included: several phases are selected as "not any of the others".
var knownPhases = []v1alpha1.Phase{
	"",
	v1alpha1.PhasePending,
	v1alpha1.PhaseScheduled,
	v1alpha1.PhaseRunning,
	v1alpha1.PhaseReady,
	v1alpha1.PhaseSucceeded,
	v1alpha1.PhaseFailed,
	v1alpha1.PhaseTimeout,
	v1alpha1.PhaseCancelled,
}

// resource implements store.Resource for one kind.
type resource[T store.Object] struct {
	s  *Store
	rc *rest.RESTClient
	k  *kind[T]
}

var (
	_ store.Resource[*v1alpha1.Run]     = (*resource[*v1alpha1.Run])(nil)
	_ store.Resource[*v1alpha1.Runtime] = (*resource[*v1alpha1.Runtime])(nil)
)

// clean makes an object from the API what the store returns: apiVersion
// and kind set (the JSON decoder leaves them empty), no managedFields.
func (r *resource[T]) clean(obj T) T {
	obj.GetObjectKind().SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind(r.k.name))
	obj.SetManagedFields(nil)
	return obj
}

func defaultNamespace(ns string) string {
	if ns == "" {
		return store.DefaultNamespace
	}
	return ns
}

// Get implements store.Reader.
func (r *resource[T]) Get(ctx context.Context, namespace, name string) (T, error) {
	var zero T
	namespace = defaultNamespace(namespace)
	if err := r.s.check(); err != nil {
		return zero, err
	}
	if name == "" {
		return zero, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "get: the name is empty")
	}
	out := r.k.new()
	if err := into(r.rc.Get().Namespace(namespace).Resource(r.k.resource).Name(name).Do(ctx), out); err != nil {
		return zero, r.fail("get", namespace, name, err)
	}
	return r.clean(out), nil
}

// List implements store.Reader.
func (r *resource[T]) List(ctx context.Context, opts store.ListOptions) ([]T, string, error) {
	if err := r.s.check(); err != nil {
		return nil, "", err
	}
	sel, filter, err := r.fieldSelector(opts.Phases, opts.AssignedPodUID, opts.PlacedPodUID)
	if err != nil {
		return nil, "", err
	}
	var (
		out     []T
		version string
		next    string
	)
	for first := true; ; first = false {
		req := r.rc.Get().Resource(r.k.resource).Param("limit", strconv.FormatInt(r.s.listPage, 10))
		if opts.Namespace != "" {
			req = req.Namespace(opts.Namespace)
		}
		if opts.LabelSelector != nil && !opts.LabelSelector.Empty() {
			req = req.Param("labelSelector", opts.LabelSelector.String())
		}
		if sel != "" {
			req = req.Param("fieldSelector", sel)
		}
		if next != "" {
			req = req.Param("continue", next)
		}
		list := r.k.newList()
		if err := into(req.Do(ctx), list); err != nil {
			return nil, "", r.failList(opts.Namespace, err)
		}
		for _, it := range r.k.items(list) {
			if filter == nil || filter(it) {
				out = append(out, r.clean(it))
			}
		}
		lm, err := meta.ListAccessor(list)
		if err != nil {
			return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, err)
		}
		if first {
			// Every page is of the first one's version.
			version = lm.GetResourceVersion()
		}
		if next = lm.GetContinue(); next == "" {
			return out, version, nil
		}
	}
}

// fieldSelector turns the phase and assigned-pod filters into a field
// selector, and a filter for what the selector cannot say exactly.
func (r *resource[T]) fieldSelector(phases []v1alpha1.Phase, podUID, placedUID string) (string, func(T) bool, error) {
	if len(phases) > 0 && !r.k.hasPhase {
		return "", nil, fmt.Errorf("list %ss: a phase filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if podUID != "" && !r.k.hasPod {
		return "", nil, fmt.Errorf("%ss: an assigned pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if placedUID != "" && !r.k.hasPod {
		return "", nil, fmt.Errorf("%ss: a placed pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	var (
		terms  []fields.Selector
		filter func(T) bool
	)
	if podUID != "" {
		terms = append(terms, fields.OneTermEqualSelector(fieldAssignedPodUID, podUID))
	}
	if placedUID != "" {
		terms = append(terms, fields.OneTermEqualSelector(fieldPlacedPodUID, placedUID))
	}
	switch {
	case len(phases) == 1:
		terms = append(terms, fields.OneTermEqualSelector(fieldPhase, string(phases[0])))
	case len(phases) > 1:
		for _, p := range knownPhases {
			if !slices.Contains(phases, p) {
				terms = append(terms, fields.OneTermNotEqualSelector(fieldPhase, string(p)))
			}
		}
		// "!=" every other known phase lets a phase this code does not
		// know through.
		filter = func(obj T) bool { return slices.Contains(phases, r.k.phase(obj)) }
	}
	if len(terms) == 0 {
		return "", filter, nil
	}
	return fields.AndSelectors(terms...).String(), filter, nil
}

// Create implements store.Writer.
func (r *resource[T]) Create(ctx context.Context, in T) (T, error) {
	var zero T
	if err := r.s.check(); err != nil {
		return zero, err
	}
	if isNil(in) {
		return zero, fmt.Errorf("create %s: no object: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	obj := in.DeepCopyObject().(T)
	namespace, name := defaultNamespace(obj.GetNamespace()), obj.GetName()
	obj.SetNamespace(namespace)
	if name == "" && obj.GetGenerateName() == "" {
		return zero, fmt.Errorf("create %s in %s: metadata.name or metadata.generateName is required: %w", r.k.noun, namespace, errdefs.ErrInvalidArgument)
	}
	if obj.GetResourceVersion() != "" {
		return zero, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "create: resourceVersion must not be set")
	}
	obj.SetManagedFields(nil)
	out := r.k.new()
	req := r.rc.Post().Namespace(namespace).Resource(r.k.resource).Param("fieldManager", r.s.fieldManager)
	if err := into(req.Body(obj).Do(ctx), out); err != nil {
		if name == "" {
			name = obj.GetGenerateName() + "*"
		}
		return zero, r.fail("create", namespace, name, err)
	}
	return r.clean(out), nil
}

// into decodes a successful answer into out (decodeInto), or returns the
// request's error, the API server's Status when its body holds one (as
// Result.Into does).
func into(res rest.Result, out any) error {
	body, err := res.Raw()
	if err != nil {
		return res.Error()
	}
	return decodeInto(body, out)
}

// isNil reports whether a typed pointer in an interface-constrained
// parameter is nil.
func isNil[T store.Object](obj T) bool {
	switch o := any(obj).(type) {
	case *v1alpha1.Run:
		return o == nil
	case *v1alpha1.Runtime:
		return o == nil
	}
	return false
}

// Update implements store.Writer.
func (r *resource[T]) Update(ctx context.Context, in T) (T, error) {
	return r.put(ctx, in, "update", "")
}

// UpdateStatus implements store.StatusWriter.
func (r *resource[T]) UpdateStatus(ctx context.Context, in T) (T, error) {
	return r.put(ctx, in, "update status of", "status")
}

// put replaces the object, or its status subresource; the API server
// keeps the part the request does not own and checks the resourceVersion.
func (r *resource[T]) put(ctx context.Context, in T, verb, subresource string) (T, error) {
	var zero T
	if err := r.s.check(); err != nil {
		return zero, err
	}
	if isNil(in) {
		return zero, fmt.Errorf("%s %s: no object: %w", verb, r.k.noun, errdefs.ErrInvalidArgument)
	}
	namespace, name := defaultNamespace(in.GetNamespace()), in.GetName()
	if name == "" {
		return zero, fmt.Errorf("%s %s in %s: metadata.name is required: %w", verb, r.k.noun, namespace, errdefs.ErrInvalidArgument)
	}
	if in.GetResourceVersion() == "" {
		return zero, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: resourceVersion must be set", verb)
	}
	obj := in
	if in.GetNamespace() == "" {
		obj = in.DeepCopyObject().(T)
		obj.SetNamespace(namespace)
	}
	req := r.rc.Put().Namespace(namespace).Resource(r.k.resource).Name(name).Param("fieldManager", r.s.fieldManager)
	if subresource != "" {
		req = req.SubResource(subresource)
	}
	out := r.k.new()
	if err := into(req.Body(obj).Do(ctx), out); err != nil {
		return zero, r.fail(verb, namespace, name, err)
	}
	return r.clean(out), nil
}

// Delete implements store.Writer.
func (r *resource[T]) Delete(ctx context.Context, namespace, name string, opts store.DeleteOptions) error {
	namespace = defaultNamespace(namespace)
	if err := r.s.check(); err != nil {
		return err
	}
	if name == "" {
		return r.errorf(namespace, name, errdefs.ErrInvalidArgument, "delete: the name is empty")
	}
	del := &metav1.DeleteOptions{}
	if p := opts.Preconditions; p.UID != "" || p.ResourceVersion != "" {
		del.Preconditions = &metav1.Preconditions{}
		if p.UID != "" {
			uid := types.UID(p.UID)
			del.Preconditions.UID = &uid
		}
		if p.ResourceVersion != "" {
			rv := p.ResourceVersion
			del.Preconditions.ResourceVersion = &rv
		}
	}
	if err := r.rc.Delete().Namespace(namespace).Resource(r.k.resource).Name(name).Body(del).Do(ctx).Error(); err != nil {
		return r.fail("delete", namespace, name, err)
	}
	return nil
}
