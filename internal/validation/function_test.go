package validation

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// validFunction is a Function as SetFunctionDefaults leaves it.
func validFunction() *v1alpha1.Function {
	fn := &v1alpha1.Function{}
	fn.Name, fn.Namespace, fn.UID = "hello", "default", "fn-1"
	fn.Spec = v1alpha1.FunctionSpec{
		Runtime: "python",
		Handler: "main.handler",
		Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.py", Text: "def handler(event, context):\n    return event\n"}},
		Env:     []v1alpha1.EnvVar{{Name: "GREETING", Value: "hi"}},
		Scale:   v1alpha1.FunctionScale{Min: 0, Max: 8},
	}
	SetFunctionDefaults(fn)
	return fn
}

type functionCase struct {
	name   string
	mutate func(*v1alpha1.Function)
	field  string
}

// functionCases are the Functions both stores must refuse or accept alike
// (crd_kube_test.go holds the API server to them).
var functionCases = []functionCase{
	{"valid", func(*v1alpha1.Function) {}, ""},
	{"min 2 max 2", func(f *v1alpha1.Function) { f.Spec.Scale.Min, f.Spec.Scale.Max = 2, 2 }, ""},
	{"min > max", func(f *v1alpha1.Function) { f.Spec.Scale.Min, f.Spec.Scale.Max = 3, 2 }, "spec.scale"},
	{"min negative", func(f *v1alpha1.Function) { f.Spec.Scale.Min = -1 }, "spec.scale.min"},
	{"min huge", func(f *v1alpha1.Function) { f.Spec.Scale.Min, f.Spec.Scale.Max = 1025, 1024 }, "spec.scale.min"},
	{"max huge", func(f *v1alpha1.Function) { f.Spec.Scale.Max = 1025 }, "spec.scale.max"},
	{"max negative", func(f *v1alpha1.Function) { f.Spec.Scale.Max = -1 }, "spec.scale.max"},
	{"max 1024", func(f *v1alpha1.Function) { f.Spec.Scale.Max = bounds.FunctionReplicas }, ""},
	{"replicas 3", func(f *v1alpha1.Function) { f.Spec.Replicas = ptr(int32(3)) }, ""},
	{"replicas negative", func(f *v1alpha1.Function) { f.Spec.Replicas = ptr(int32(-1)) }, "spec.replicas"},
	{"replicas huge", func(f *v1alpha1.Function) { f.Spec.Replicas = ptr(int32(1 << 20)) }, "spec.replicas"},
	{"targetInFlight huge", func(f *v1alpha1.Function) { f.Spec.Scale.TargetInFlight = 1025 }, "spec.scale.targetInFlight"},
	{"targetInFlight negative", func(f *v1alpha1.Function) { f.Spec.Scale.TargetInFlight = -1 }, "spec.scale.targetInFlight"},
	{"idleSeconds negative", func(f *v1alpha1.Function) { f.Spec.Scale.IdleSeconds = -5 }, "spec.scale.idleSeconds"},
	{"idleSeconds over a day", func(f *v1alpha1.Function) { f.Spec.Scale.IdleSeconds = 86401 }, "spec.scale.idleSeconds"},
	{"queue length huge", func(f *v1alpha1.Function) { f.Spec.Queue.Length = bounds.MaxFunctionQueue + 1 }, "spec.queue.length"},
	{"queue length negative", func(f *v1alpha1.Function) { f.Spec.Queue.Length = -1 }, "spec.queue.length"},
	{"queue wait negative", func(f *v1alpha1.Function) { f.Spec.Queue.MaxWait = &metav1.Duration{Duration: -time.Second} }, "spec.queue.maxWait"},
	{"queue wait over 15m", func(f *v1alpha1.Function) { f.Spec.Queue.MaxWait = &metav1.Duration{Duration: 16 * time.Minute} }, "spec.queue.maxWait"},
	{"queue wait 15m", func(f *v1alpha1.Function) { f.Spec.Queue.MaxWait = &metav1.Duration{Duration: 15 * time.Minute} }, ""},
	{"drainSeconds huge", func(f *v1alpha1.Function) { f.Spec.DrainSeconds = 301 }, "spec.drainSeconds"},
	{"name 63", func(f *v1alpha1.Function) { f.Name = strings.Repeat("f", 63) }, ""},
	{"name 64", func(f *v1alpha1.Function) { f.Name = strings.Repeat("f", 64) }, "metadata.name"},
	{"name with dot", func(f *v1alpha1.Function) { f.Name = "a.b" }, "metadata.name"},
	{"runtime empty", func(f *v1alpha1.Function) { f.Spec.Runtime = "" }, "spec.runtime"},
	{"handler without function", func(f *v1alpha1.Function) { f.Spec.Handler = "main" }, "spec.handler"},
	{"handler absolute", func(f *v1alpha1.Function) { f.Spec.Handler = "/main.handler" }, "spec.handler"},
	{"timeout negative", func(f *v1alpha1.Function) { f.Spec.Timeout = &metav1.Duration{Duration: -1} }, "spec.timeout"},
	{"env name bad", func(f *v1alpha1.Function) { f.Spec.Env = []v1alpha1.EnvVar{{Name: "1X", Value: "v"}} }, "spec.env[0]"},
	{"source path up", func(f *v1alpha1.Function) { f.Spec.Source.Inline.Path = "../main.py" }, "spec.source.inline.path"},
}

func TestValidateFunction(t *testing.T) {
	for _, tt := range functionCases {
		t.Run(tt.name, func(t *testing.T) {
			fn := validFunction()
			tt.mutate(fn)
			checkErr(t, ValidateFunction(fn), tt.field)
		})
	}
}

var functionUpdateCases = []functionCase{
	{"roll", func(f *v1alpha1.Function) { f.Spec.Handler = "main.other" }, ""},
	{"scale", func(f *v1alpha1.Function) { f.Spec.Replicas = ptr(int32(4)); f.Spec.Scale.Min = 1 }, ""},
	{"min > max", func(f *v1alpha1.Function) { f.Spec.Scale.Min = 9 }, "spec.scale"},
	{"name", func(f *v1alpha1.Function) { f.Name = "other" }, "metadata.name"},
	{"uid", func(f *v1alpha1.Function) { f.UID = "fn-2" }, "metadata.uid"},
}

func TestValidateFunctionUpdate(t *testing.T) {
	for _, tt := range functionUpdateCases {
		t.Run(tt.name, func(t *testing.T) {
			old := validFunction()
			nw := old.DeepCopy()
			tt.mutate(nw)
			checkErr(t, ValidateFunctionUpdate(old, nw), tt.field)
		})
	}
}

func TestSetFunctionDefaults(t *testing.T) {
	fn := &v1alpha1.Function{}
	SetFunctionDefaults(fn)
	want := v1alpha1.FunctionSpec{
		Scale: v1alpha1.FunctionScale{Min: 0, Max: bounds.DefaultFunctionMax, TargetInFlight: 1, IdleSeconds: bounds.DefaultFunctionIdleSeconds},
		Queue: v1alpha1.FunctionQueue{Length: bounds.FunctionQueue, MaxWait: &metav1.Duration{Duration: bounds.FunctionQueueWait}},

		DrainSeconds: bounds.DefaultFunctionDrainSeconds,
	}
	if fn.Namespace != DefaultNamespace || fn.Kind != v1alpha1.KindFunction || fn.APIVersion != v1alpha1.GroupVersion.String() {
		t.Errorf("meta %v %v", fn.TypeMeta, fn.Namespace)
	}
	if got, w := fn.Spec.Scale, want.Scale; got != w {
		t.Errorf("scale %+v, want %+v", got, w)
	}
	if fn.Spec.Queue.Length != want.Queue.Length || *fn.Spec.Queue.MaxWait != *want.Queue.MaxWait || fn.Spec.DrainSeconds != want.DrainSeconds {
		t.Errorf("queue %+v drain %d", fn.Spec.Queue, fn.Spec.DrainSeconds)
	}
	if fn.Spec.Replicas != nil {
		t.Errorf("replicas defaulted to %d; unset means scale.min", *fn.Spec.Replicas)
	}
	// Set values stay.
	set := validFunction()
	set.Spec.Scale = v1alpha1.FunctionScale{Min: 2, Max: 3, TargetInFlight: 2, IdleSeconds: 5}
	SetFunctionDefaults(set)
	if set.Spec.Scale != (v1alpha1.FunctionScale{Min: 2, Max: 3, TargetInFlight: 2, IdleSeconds: 5}) {
		t.Errorf("defaults overwrote %+v", set.Spec.Scale)
	}
}
