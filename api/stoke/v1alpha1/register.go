package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and version of Stoke's API.
const (
	Group   = "stoke.dev"
	Version = "v1alpha1"
)

// GroupVersion is stoke.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// SchemeGroupVersion is GroupVersion under the name client-go's scheme
// conventions use.
var SchemeGroupVersion = GroupVersion

// SchemeBuilder registers Run, Runtime, Function, WorkflowRun, Workflow and their lists; AddToScheme adds
// them to a runtime.Scheme for client-go and controller-runtime clients.
var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &Run{}, &RunList{}, &Runtime{}, &RuntimeList{}, &Function{}, &FunctionList{},
		&WorkflowRun{}, &WorkflowRunList{}, &Workflow{}, &WorkflowList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
