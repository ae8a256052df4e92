package sqlite

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// kind is what the generic code needs to know about one stored kind: its
// name in the database and in messages, and how to split spec from status.
//
// setSpec and setStatus copy the part through JSON rather than with
// DeepCopy: the stored form is JSON, which drops what it cannot hold (time
// below a second, empty versus nil), and an object returned by a write must
// be exactly what a later Get decodes. Round-tripping only the part that
// changed is much cheaper than decoding the whole object after every write.
type kind[T store.Object] struct {
	name string // Kind, also the objects.kind and events.kind column
	noun string // lower case, for error messages
	// hasPhase says whether ListOptions.Phases applies.
	hasPhase bool
	new      func() T
	// setSpec replaces dst's spec with src's as stored, and returns the
	// spec's JSON.
	setSpec func(dst, src T) ([]byte, error)
	// setStatus replaces dst's status with src's as stored.
	setStatus func(dst, src T) error
	// clearStatus resets the status to its zero value.
	clearStatus func(obj T)
	// spec returns the spec's JSON, to tell whether Update changed it.
	spec func(obj T) ([]byte, error)
	// phase is the value of the objects.phase column.
	phase func(obj T) string
	// assignedPodUID returns what ListOptions.AssignedPodUID and
	// WatchOptions.AssignedPodUID select on; nil for kinds without it.
	assignedPodUID func(obj T) string
	// placedPodUID returns what ListOptions.PlacedPodUID and
	// WatchOptions.PlacedPodUID select on; nil for kinds without it.
	placedPodUID func(obj T) string
}

// gvk is the group, version and kind set on every stored object, so that
// what `stoke get -o yaml` prints can be applied again.
func gvk(kind string) schema.GroupVersionKind { return v1alpha1.GroupVersion.WithKind(kind) }

// roundTrip returns *src as it comes back from its JSON, and the JSON.
func roundTrip[V any](src *V) (V, []byte, error) {
	var out V
	b, err := json.Marshal(src)
	if err != nil {
		return out, nil, err
	}
	err = json.Unmarshal(b, &out)
	return out, b, err
}

var runKind = &kind[*v1alpha1.Run]{
	name:     v1alpha1.KindRun,
	noun:     "run",
	hasPhase: true,
	new:      func() *v1alpha1.Run { return new(v1alpha1.Run) },
	setSpec: func(dst, src *v1alpha1.Run) ([]byte, error) {
		spec, b, err := roundTrip(&src.Spec)
		dst.Spec = spec
		return b, err
	},
	setStatus: func(dst, src *v1alpha1.Run) error {
		status, _, err := roundTrip(&src.Status)
		dst.Status = status
		return err
	},
	clearStatus:    func(obj *v1alpha1.Run) { obj.Status = v1alpha1.RunStatus{} },
	spec:           func(obj *v1alpha1.Run) ([]byte, error) { return json.Marshal(&obj.Spec) },
	phase:          func(obj *v1alpha1.Run) string { return string(obj.Status.Phase) },
	assignedPodUID: func(obj *v1alpha1.Run) string { return obj.Status.AssignedPodUID },
	placedPodUID: func(obj *v1alpha1.Run) string {
		if pl := obj.Spec.Placement; pl != nil {
			return pl.PodUID
		}
		return ""
	},
}

var runtimeKind = &kind[*v1alpha1.Runtime]{
	name: v1alpha1.KindRuntime,
	noun: "runtime",
	new:  func() *v1alpha1.Runtime { return new(v1alpha1.Runtime) },
	setSpec: func(dst, src *v1alpha1.Runtime) ([]byte, error) {
		spec, b, err := roundTrip(&src.Spec)
		dst.Spec = spec
		return b, err
	},
	setStatus: func(dst, src *v1alpha1.Runtime) error {
		status, _, err := roundTrip(&src.Status)
		dst.Status = status
		return err
	},
	clearStatus: func(obj *v1alpha1.Runtime) { obj.Status = v1alpha1.RuntimeStatus{} },
	spec:        func(obj *v1alpha1.Runtime) ([]byte, error) { return json.Marshal(&obj.Spec) },
	phase:       func(*v1alpha1.Runtime) string { return "" },
}

var functionKind = &kind[*v1alpha1.Function]{
	name: v1alpha1.KindFunction,
	noun: "function",
	new:  func() *v1alpha1.Function { return new(v1alpha1.Function) },
	setSpec: func(dst, src *v1alpha1.Function) ([]byte, error) {
		spec, b, err := roundTrip(&src.Spec)
		dst.Spec = spec
		return b, err
	},
	setStatus: func(dst, src *v1alpha1.Function) error {
		status, _, err := roundTrip(&src.Status)
		dst.Status = status
		return err
	},
	clearStatus: func(obj *v1alpha1.Function) { obj.Status = v1alpha1.FunctionStatus{} },
	spec:        func(obj *v1alpha1.Function) ([]byte, error) { return json.Marshal(&obj.Spec) },
	phase:       func(*v1alpha1.Function) string { return "" },
}

var workflowRunKind = &kind[*v1alpha1.WorkflowRun]{
	name: v1alpha1.KindWorkflowRun,
	noun: "workflowrun",
	new:  func() *v1alpha1.WorkflowRun { return new(v1alpha1.WorkflowRun) },
	setSpec: func(dst, src *v1alpha1.WorkflowRun) ([]byte, error) {
		spec, b, err := roundTrip(&src.Spec)
		dst.Spec = spec
		return b, err
	},
	setStatus: func(dst, src *v1alpha1.WorkflowRun) error {
		status, _, err := roundTrip(&src.Status)
		dst.Status = status
		return err
	},
	clearStatus: func(obj *v1alpha1.WorkflowRun) { obj.Status = v1alpha1.WorkflowRunStatus{} },
	spec:        func(obj *v1alpha1.WorkflowRun) ([]byte, error) { return json.Marshal(&obj.Spec) },
	phase:       func(*v1alpha1.WorkflowRun) string { return "" },
}

var workflowKind = &kind[*v1alpha1.Workflow]{
	name: v1alpha1.KindWorkflow,
	noun: "workflow",
	new:  func() *v1alpha1.Workflow { return new(v1alpha1.Workflow) },
	setSpec: func(dst, src *v1alpha1.Workflow) ([]byte, error) {
		spec, b, err := roundTrip(&src.Spec)
		dst.Spec = spec
		return b, err
	},
	setStatus: func(dst, src *v1alpha1.Workflow) error {
		status, _, err := roundTrip(&src.Status)
		dst.Status = status
		return err
	},
	clearStatus: func(obj *v1alpha1.Workflow) { obj.Status = v1alpha1.WorkflowStatus{} },
	spec:        func(obj *v1alpha1.Workflow) ([]byte, error) { return json.Marshal(&obj.Spec) },
	phase:       func(*v1alpha1.Workflow) string { return "" },
}
