package validation

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/printer"
	"stoke.dev/stoke/internal/kubetest"
)

// kubeOnly are the cases of the tables in validation_test.go whose answer
// is not the CRD's to give: the client and the URL, not the body, name the
// object's kind, namespace and name, and CEL cannot read finalizers. What
// the API server answers for them is beside the point; every other case
// must get the same answer from the API server as from internal/validation.
var kubeOnly = map[string]string{
	"Run/wrong apiVersion":                "the client sets apiVersion and kind from the Go type",
	"Run/wrong kind":                      "the client sets apiVersion and kind from the Go type",
	"Run/namespace empty":                 "the URL names the namespace",
	"Run/namespace 63":                    "the URL names the namespace, which must exist",
	"Run/namespace 64":                    "the URL names the namespace",
	"Run/namespace with dot":              "the URL names the namespace",
	"Run/Stoke's finalizer":               "CEL cannot read metadata.finalizers (docs/crds.md)",
	"RunUpdate/name":                      "the URL names the object",
	"RunUpdate/namespace":                 "the URL names the namespace",
	"RunUpdate/uid":                       "a UID that differs is a failed precondition (409), not a validation error",
	"Runtime/wrong kind":                  "the client sets apiVersion and kind from the Go type",
	"Runtime/namespace empty":             "the URL names the namespace",
	"RuntimeUpdate/name":                  "the URL names the object",
	"RuntimeUpdate/uid":                   "a UID that differs is a failed precondition (409), not a validation error",
	"FunctionUpdate/name":                 "the URL names the object",
	"FunctionUpdate/uid":                  "a UID that differs is a failed precondition (409), not a validation error",
	"Runtime/template env name":           "CEL's cost budget: a rule over core/v1 strings, which have no maxLength, is refused in the CRD (the controller passes handlers only the names they can carry)",
	"Runtime/template mount of no volume": "CEL's cost budget, as above; the API server refuses the Deployment",
}

// TestCRD applies the generated CRDs to a real kube-apiserver and holds
// them to internal/validation: every case of the validation tables (but
// kubeOnly) is refused by the API server exactly when internal/validation
// refuses it, with a 422 naming the same field; the examples pass both; the
// selectable fields select; kubectl prints the columns of `stoke get`.
func TestCRD(t *testing.T) {
	for key := range kubeOnly {
		kind, name, _ := strings.Cut(key, "/")
		if !slices.Contains(caseNames(t, kind), name) {
			t.Fatalf("kubeOnly names %s, which is no case", key)
		}
	}
	c := kubetest.Start(t, kubetest.Options{})
	api := stokeClient(t, c.Config)
	ns := c.Namespace(t)

	t.Run("Run", func(t *testing.T) {
		for i, tt := range runCases(t) {
			t.Run(tt.name, func(t *testing.T) {
				if reason, ok := kubeOnly["Run/"+tt.name]; ok {
					t.Logf("not the CRD's to decide: %s", reason)
					return
				}
				base := tt.base()
				r := tt.base()
				tt.mutate(r)
				if r.Name == base.Name {
					r.Name = fmt.Sprintf("case-%d", i)
				}
				r.Namespace, r.UID = ns, ""
				_, err := apiCreate(t, api, "runs", r, &v1alpha1.Run{})
				agree(t, err, tt.field)
			})
		}
	})

	t.Run("RunUpdate", func(t *testing.T) {
		for i, tt := range runUpdateCases {
			t.Run(tt.name, func(t *testing.T) {
				if reason, ok := kubeOnly["RunUpdate/"+tt.name]; ok {
					t.Logf("not the CRD's to decide: %s", reason)
					return
				}
				old := taskRun()
				old.Name, old.Namespace, old.UID = fmt.Sprintf("update-%d", i), ns, ""
				if tt.old != nil {
					tt.old(old)
				}
				stored, err := apiCreate(t, api, "runs", old, &v1alpha1.Run{})
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				nw := stored.DeepCopy()
				tt.mutate(nw)
				_, err = apiUpdate(t, api, "runs", nw, &v1alpha1.Run{})
				agree(t, err, tt.field)
			})
		}
	})

	t.Run("Runtime", func(t *testing.T) {
		for i, tt := range runtimeCases {
			t.Run(tt.name, func(t *testing.T) {
				if reason, ok := kubeOnly["Runtime/"+tt.name]; ok {
					t.Logf("not the CRD's to decide: %s", reason)
					return
				}
				rt := validRuntime()
				tt.mutate(rt)
				if rt.Name == validRuntime().Name {
					rt.Name = fmt.Sprintf("case-%d", i)
				}
				rt.Namespace, rt.UID = ns, ""
				_, err := apiCreate(t, api, "runtimes", rt, &v1alpha1.Runtime{})
				agree(t, err, tt.field)
			})
		}
	})

	t.Run("RuntimeUpdate", func(t *testing.T) {
		for i, tt := range runtimeUpdateCases {
			t.Run(tt.name, func(t *testing.T) {
				if reason, ok := kubeOnly["RuntimeUpdate/"+tt.name]; ok {
					t.Logf("not the CRD's to decide: %s", reason)
					return
				}
				old := validRuntime()
				old.Name, old.Namespace, old.UID = fmt.Sprintf("update-%d", i), ns, ""
				stored, err := apiCreate(t, api, "runtimes", old, &v1alpha1.Runtime{})
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				nw := stored.DeepCopy()
				tt.mutate(nw)
				_, err = apiUpdate(t, api, "runtimes", nw, &v1alpha1.Runtime{})
				agree(t, err, tt.field)
			})
		}
	})

	t.Run("Function", func(t *testing.T) {
		for i, tt := range functionCases {
			t.Run(tt.name, func(t *testing.T) {
				fn := validFunction()
				tt.mutate(fn)
				if fn.Name == validFunction().Name {
					fn.Name = fmt.Sprintf("case-%d", i)
				}
				fn.Namespace, fn.UID = ns, ""
				_, err := apiCreate(t, api, "functions", fn, &v1alpha1.Function{})
				agree(t, err, tt.field)
			})
		}
	})

	// The WorkflowRun cases CEL and OpenAPI can say (crd): the API server
	// refuses exactly those internal/validation refuses, at the same field.
	// The others (cycles, expressions, calls, a matrix's size) need a
	// parser, a graph or a lookup: the controller runs the same validation
	// when a run starts.
	t.Run("WorkflowRun", func(t *testing.T) {
		for i, tt := range workflowRunCases {
			if !tt.crd {
				continue
			}
			t.Run(tt.name, func(t *testing.T) {
				w := validWorkflowRun()
				tt.mutate(w)
				if w.Name == validWorkflowRun().Name {
					w.Name = fmt.Sprintf("wfr-%d", i)
				}
				w.Namespace, w.UID = ns, ""
				_, err := apiCreate(t, api, "workflowruns", w, &v1alpha1.WorkflowRun{})
				agree(t, err, tt.field)
			})
		}
		// cancelRequested cannot be unset.
		w := validWorkflowRun()
		w.Name, w.Namespace = "cancelled", ns
		w.Spec.CancelRequested = true
		stored, err := apiCreate(t, api, "workflowruns", w, &v1alpha1.WorkflowRun{})
		if err != nil {
			t.Fatal(err)
		}
		stored.Spec.CancelRequested = false
		_, err = apiUpdate(t, api, "workflowruns", stored, &v1alpha1.WorkflowRun{})
		mustRefuse(t, err, "spec.cancelRequested", "cannot be unset once true")
	})

	t.Run("FunctionUpdate", func(t *testing.T) {
		for i, tt := range functionUpdateCases {
			t.Run(tt.name, func(t *testing.T) {
				if reason, ok := kubeOnly["FunctionUpdate/"+tt.name]; ok {
					t.Logf("not the CRD's to decide: %s", reason)
					return
				}
				old := validFunction()
				old.Name, old.Namespace, old.UID = fmt.Sprintf("fn-update-%d", i), ns, ""
				stored, err := apiCreate(t, api, "functions", old, &v1alpha1.Function{})
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				nw := stored.DeepCopy()
				tt.mutate(nw)
				_, err = apiUpdate(t, api, "functions", nw, &v1alpha1.Function{})
				agree(t, err, tt.field)
			})
		}
	})

	// A Function that says only what it runs gets the defaults
	// SetFunctionDefaults gives; min > max is refused saying so, and
	// kubectl scale writes spec.replicas through the scale subresource.
	t.Run("FunctionDefaultsAndScale", func(t *testing.T) {
		bare := &v1alpha1.Function{}
		bare.Name, bare.Namespace = "bare", ns
		bare.Spec = v1alpha1.FunctionSpec{Runtime: "python", Handler: "main.handler"}
		stored, err := apiCreate(t, api, "functions", bare, &v1alpha1.Function{})
		if err != nil {
			t.Fatal(err)
		}
		want := bare.DeepCopy()
		SetFunctionDefaults(want)
		if !apiequality.Semantic.DeepEqual(stored.Spec, want.Spec) {
			t.Errorf("the API server defaulted\n%+v\nSetFunctionDefaults\n%+v", stored.Spec, want.Spec)
		}

		inverted := validFunction()
		inverted.Name, inverted.Namespace, inverted.UID = "inverted", ns, ""
		inverted.Spec.Scale.Min, inverted.Spec.Scale.Max = 5, 2
		_, err = apiCreate(t, api, "functions", inverted, &v1alpha1.Function{})
		mustRefuse(t, err, "spec.scale", "scale.min must not exceed scale.max")
		if err := api.Get().Namespace(ns).Resource("functions").Name("inverted").Do(t.Context()).Error(); !apierrors.IsNotFound(err) {
			t.Fatalf("the refused Function: %v, want NotFound", err)
		}

		if out := c.Kubectl(t, "scale", "-n", ns, "function/bare", "--replicas=3"); !strings.Contains(out, "scaled") {
			t.Fatalf("kubectl scale: %s", out)
		}
		var got v1alpha1.Function
		if err := api.Get().Namespace(ns).Resource("functions").Name("bare").Do(t.Context()).Into(&got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.Replicas == nil || *got.Spec.Replicas != 3 {
			t.Fatalf("after kubectl scale --replicas=3, spec.replicas is %v", got.Spec.Replicas)
		}
		// The scale subresource reads status.replicas and the selector.
		got.Status = v1alpha1.FunctionStatus{Replicas: 2, ReadyReplicas: 1, InFlight: 1, Queued: 4, Selector: v1alpha1.LabelFunction + "=bare"}
		if err := api.Put().Namespace(ns).Resource("functions").Name("bare").SubResource("status").Body(&got).Do(t.Context()).Error(); err != nil {
			t.Fatal(err)
		}
		scale := c.Kubectl(t, "get", "--raw", "/apis/stoke.dev/v1alpha1/namespaces/"+ns+"/functions/bare/scale")
		for _, w := range []string{`"replicas":3`, `"replicas":2`, `"selector":"stoke.dev/function=bare"`} {
			if !strings.Contains(scale, w) {
				t.Errorf("scale subresource %s lacks %s", scale, w)
			}
		}
		cols := table(t, c.Kubectl(t, "get", "functions", "bare", "-n", ns))
		for col, w := range map[string]string{"RUNTIME": "python", "READY": "1", "IN-FLIGHT": "1", "QUEUED": "4"} {
			if cols[col] != w {
				t.Errorf("kubectl get functions: %s is %q, want %q (%v)", col, cols[col], w, cols)
			}
		}
	})

	// The cases the issue names, with the answer a user sees.
	t.Run("Named", func(t *testing.T) {
		both := taskRun()
		both.Name, both.Namespace, both.UID = "both-modes", ns, ""
		both.Spec.Mode.Function = &v1alpha1.FunctionMode{Handler: "h.f"}
		_, err := apiCreate(t, api, "runs", both, &v1alpha1.Run{})
		mustRefuse(t, err, "spec.mode", "exactly one of task or function must be set")

		run := taskRun()
		run.Name, run.Namespace, run.UID = "named", ns, ""
		stored, err := apiCreate(t, api, "runs", run, &v1alpha1.Run{})
		if err != nil {
			t.Fatal(err)
		}
		moved := stored.DeepCopy()
		moved.Spec.Runtime = "python"
		_, err = apiUpdate(t, api, "runs", moved, &v1alpha1.Run{})
		mustRefuse(t, err, "spec.runtime", "is immutable")

		cancel := stored.DeepCopy()
		cancel.Spec.CancelRequested = true
		cancelled, err := apiUpdate(t, api, "runs", cancel, &v1alpha1.Run{})
		if err != nil {
			t.Fatalf("cancelRequested false → true: %v", err)
		}
		uncancel := cancelled.DeepCopy()
		uncancel.Spec.CancelRequested = false
		_, err = apiUpdate(t, api, "runs", uncancel, &v1alpha1.Run{})
		mustRefuse(t, err, "spec.cancelRequested", "cannot be unset once true")

		held := taskRun()
		held.Name, held.Namespace, held.UID = "held", ns, ""
		held.Spec.Held = true
		storedHeld, err := apiCreate(t, api, "runs", held, &v1alpha1.Run{})
		if err != nil {
			t.Fatal(err)
		}
		release := storedHeld.DeepCopy()
		release.Spec.Held = false
		released, err := apiUpdate(t, api, "runs", release, &v1alpha1.Run{})
		if err != nil {
			t.Fatalf("held true → false: %v", err)
		}
		rehold := released.DeepCopy()
		rehold.Spec.Held = true
		_, err = apiUpdate(t, api, "runs", rehold, &v1alpha1.Run{})
		mustRefuse(t, err, "spec.held", "cannot be set once cleared")

		long := taskRun()
		long.Name, long.Namespace, long.UID = strings.Repeat("n", 254), ns, ""
		_, err = apiCreate(t, api, "runs", long, &v1alpha1.Run{})
		mustRefuse(t, err, "metadata.name", "253")

		crowded := taskRun()
		crowded.Name, crowded.Namespace, crowded.UID = "crowded", ns, ""
		crowded.Spec.Env = envOf(257)
		_, err = apiCreate(t, api, "runs", crowded, &v1alpha1.Run{})
		mustRefuse(t, err, "spec.env", "256")

		// A template that would break the runtime Pod: refused with the
		// reason, and nothing is stored.
		breaks := validRuntime()
		breaks.Name, breaks.Namespace, breaks.UID = "breaks-the-pod", ns, ""
		breaks.Spec.Template = fullTemplate()
		breaks.Spec.Template.Volumes[0].Name = "workspace"
		breaks.Spec.Template.VolumeMounts[0] = corev1.VolumeMount{Name: "workspace", MountPath: "/var/run/stoke"}
		breaks.Spec.Template.Env = append(breaks.Spec.Template.Env, corev1.EnvVar{Name: "POD_UID", Value: "x"})
		_, err = apiCreate(t, api, "runtimes", breaks, &v1alpha1.Runtime{})
		mustRefuse(t, err, "spec.template.volumes", "are the runtime Pod's own volumes")
		mustRefuse(t, err, "spec.template.volumeMounts", "may not be, or be beneath, the runtime Pod's own /var/run/stoke")
		mustRefuse(t, err, "spec.template.env", "are Stoke's own variables")
		if err := api.Get().Namespace(ns).Resource("runtimes").Name(breaks.Name).Do(t.Context()).Error(); !apierrors.IsNotFound(err) {
			t.Fatalf("the refused Runtime: %v, want NotFound", err)
		}
	})

	t.Run("Examples", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("examples: %v, %d files", err, len(files))
		}
		for _, f := range files {
			t.Run(filepath.Base(f), func(t *testing.T) {
				validateExample(t, f)
				out := c.Kubectl(t, "apply", "-n", ns, "-f", f)
				if !strings.Contains(out, "created") {
					t.Fatalf("kubectl apply -f %s: %s", f, out)
				}
			})
		}
		// The golden files of yaml_test.go set every spec field.
		for _, f := range []string{"run.yaml", "runtime.yaml"} {
			t.Run(f, func(t *testing.T) {
				b, err := os.ReadFile(filepath.Join("testdata", f))
				if err != nil {
					t.Fatal(err)
				}
				if f == "run.yaml" {
					var run v1alpha1.Run
					if err := yaml.UnmarshalStrict(b, &run); err != nil {
						t.Fatal(err)
					}
					run.Name, run.Namespace, run.UID, run.ResourceVersion = "golden", ns, "", ""
					if _, err := apiCreate(t, api, "runs", &run, &v1alpha1.Run{}); err != nil {
						t.Fatal(err)
					}
					return
				}
				var rt v1alpha1.Runtime
				if err := yaml.UnmarshalStrict(b, &rt); err != nil {
					t.Fatal(err)
				}
				rt.Name, rt.Namespace, rt.UID, rt.ResourceVersion = "golden", ns, "", ""
				if _, err := apiCreate(t, api, "runtimes", &rt, &v1alpha1.Runtime{}); err != nil {
					t.Fatal(err)
				}
			})
		}
	})

	t.Run("FieldSelectors", func(t *testing.T) {
		pod := "3f0c1e9a-pod"
		mine := writeStatus(t, api, ns, "selected", v1alpha1.RunStatus{
			Phase: v1alpha1.PhasePending, AssignedPodUID: pod, Attempt: 1,
		})
		writeStatus(t, api, ns, "other-pod", v1alpha1.RunStatus{Phase: v1alpha1.PhaseRunning, AssignedPodUID: "other", Attempt: 1})
		for _, sel := range []string{"status.assignedPodUID=" + pod, "status.phase=Pending,status.assignedPodUID=" + pod} {
			var list v1alpha1.RunList
			err := api.Get().Namespace(ns).Resource("runs").
				VersionedParams(&metav1.ListOptions{FieldSelector: sel}, metav1.ParameterCodec).
				Do(t.Context()).Into(&list)
			if err != nil {
				t.Fatalf("list %s: %v", sel, err)
			}
			if len(list.Items) != 1 || list.Items[0].UID != mine.UID {
				t.Fatalf("list %s: %d Runs, want only %s", sel, len(list.Items), mine.Name)
			}
		}
		var list v1alpha1.RunList
		err := api.Get().Namespace(ns).Resource("runs").
			VersionedParams(&metav1.ListOptions{FieldSelector: "status.phase=Pending"}, metav1.ParameterCodec).
			Do(t.Context()).Into(&list)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.Items {
			if r.Status.Phase != v1alpha1.PhasePending {
				t.Fatalf("status.phase=Pending listed %s in phase %q", r.Name, r.Status.Phase)
			}
		}
		// Only the declared fields are selectable.
		err = api.Get().Namespace(ns).Resource("runs").
			VersionedParams(&metav1.ListOptions{FieldSelector: "status.reason=x"}, metav1.ParameterCodec).
			Do(t.Context()).Into(&list)
		if !apierrors.IsBadRequest(err) {
			t.Fatalf("status.reason is not selectable: want 400, got %v", err)
		}
	})

	t.Run("Columns", func(t *testing.T) {
		run := writeStatus(t, api, ns, "columns", v1alpha1.RunStatus{
			Phase: v1alpha1.PhaseSucceeded, Reason: "Succeeded", Attempt: 2, ExitCode: ptr(int32(0)),
			AssignedPod: "bash-7d9f-x2", AssignedPodUID: "u-9", Endpoint: "http://stoke/fn",
		})
		for _, wide := range []bool{false, true} {
			args, format := []string{"get", "runs", run.Name, "-n", ns}, printer.Table
			if wide {
				args, format = append(args, "-o", "wide"), printer.Wide
			}
			var stoke bytes.Buffer
			if err := printer.New(&stoke, format, false, time.Now).Run(run); err != nil {
				t.Fatal(err)
			}
			kubectl := table(t, c.Kubectl(t, args...))
			want := table(t, stoke.String())
			// MODE has no column (docs/crds.md); AGE depends on the clock.
			delete(want, "MODE")
			delete(want, "AGE")
			if _, ok := kubectl["AGE"]; !ok {
				t.Errorf("kubectl %s: no AGE column", strings.Join(args, " "))
			}
			delete(kubectl, "AGE")
			if fmt.Sprint(kubectl) != fmt.Sprint(want) {
				t.Errorf("kubectl %s shows %v, stoke get shows %v", strings.Join(args, " "), kubectl, want)
			}
		}
	})
}

// caseNames lists the names of one case table.
func caseNames(t *testing.T, table string) []string {
	var names []string
	switch table {
	case "Run":
		for _, c := range runCases(t) {
			names = append(names, c.name)
		}
	case "RunUpdate":
		for _, c := range runUpdateCases {
			names = append(names, c.name)
		}
	case "Runtime":
		for _, c := range runtimeCases {
			names = append(names, c.name)
		}
	case "RuntimeUpdate":
		for _, c := range runtimeUpdateCases {
			names = append(names, c.name)
		}
	case "Function":
		for _, c := range functionCases {
			names = append(names, c.name)
		}
	case "FunctionUpdate":
		for _, c := range functionUpdateCases {
			names = append(names, c.name)
		}
	}
	return names
}

// stokeClient is a REST client for stoke.dev/v1alpha1.
func stokeClient(t *testing.T, cfg *rest.Config) *rest.RESTClient {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	api, err := rest.RESTClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

type object interface {
	runtime.Object
	metav1.Object
}

func apiCreate[T object](t *testing.T, api *rest.RESTClient, resource string, obj, out T) (T, error) {
	t.Helper()
	err := api.Post().Namespace(obj.GetNamespace()).Resource(resource).Body(obj).Do(t.Context()).Into(out)
	return out, err
}

func apiUpdate[T object](t *testing.T, api *rest.RESTClient, resource string, obj, out T) (T, error) {
	t.Helper()
	err := api.Put().Namespace(obj.GetNamespace()).Resource(resource).Name(obj.GetName()).Body(obj).Do(t.Context()).Into(out)
	return out, err
}

// writeStatus creates a task Run named name and writes status through the
// status subresource.
func writeStatus(t *testing.T, api *rest.RESTClient, ns, name string, st v1alpha1.RunStatus) *v1alpha1.Run {
	t.Helper()
	run := taskRun()
	run.Name, run.Namespace, run.UID = name, ns, ""
	stored, err := apiCreate(t, api, "runs", run, &v1alpha1.Run{})
	if err != nil {
		t.Fatal(err)
	}
	stored.Status = st
	out := &v1alpha1.Run{}
	err = api.Put().Namespace(ns).Resource("runs").Name(name).SubResource("status").
		Body(stored).Do(t.Context()).Into(out)
	if err != nil {
		t.Fatalf("status of %s: %v", name, err)
	}
	return out
}

// agree checks the API server's answer against internal/validation's: nil
// when field is empty, else a 422 with a cause at field, inside it, or at
// the object holding it (a CEL rule on a list names the list).
func agree(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("internal/validation accepts it, the API server refuses: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("internal/validation refuses it at %s, the API server accepts it", field)
	}
	var status *apierrors.StatusError
	if !errors.As(err, &status) || status.Status().Code != http.StatusUnprocessableEntity {
		t.Fatalf("want 422 Invalid naming %s, got %v", field, err)
	}
	var fields []string
	for _, cause := range status.Status().Details.Causes {
		switch {
		case strings.HasPrefix(cause.Field, field), cause.Field != "" && strings.HasPrefix(field, cause.Field):
			return
		case (cause.Field == "" || cause.Field == "<nil>") && strings.Contains(cause.Message, field):
			// A rule on the whole object (a Runtime's name) has no field
			// path (the API server prints a nil one); its message names
			// the field.
			return
		}
		fields = append(fields, cause.Field)
	}
	t.Fatalf("internal/validation names %s, the API server %v: %v", field, fields, err)
}

// mustRefuse wants a 422 with a cause at field whose message has want.
func mustRefuse(t *testing.T, err error, field, want string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want 422 Invalid at %s, got %v", field, err)
	}
	var status *apierrors.StatusError
	errors.As(err, &status)
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == field && strings.Contains(cause.Message, want) {
			return
		}
	}
	t.Fatalf("want %s: …%s…, got %v", field, want, err)
}

// validateExample holds an example to internal/validation, as `stoke apply`
// would after defaulting.
func validateExample(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(b, &tm); err != nil {
		t.Fatal(err)
	}
	switch tm.Kind {
	case v1alpha1.KindRun:
		var run v1alpha1.Run
		if err := yaml.UnmarshalStrict(b, &run); err != nil {
			t.Fatal(err)
		}
		SetRunDefaults(&run)
		err = ValidateRun(&run)
	case v1alpha1.KindRuntime:
		var rt v1alpha1.Runtime
		if err := yaml.UnmarshalStrict(b, &rt); err != nil {
			t.Fatal(err)
		}
		SetRuntimeDefaults(&rt)
		err = ValidateRuntime(&rt)
	default:
		t.Fatalf("kind %q", tm.Kind)
	}
	if err != nil {
		t.Fatalf("internal/validation: %v", err)
	}
}

// table reads a one-row table (a header and a row) into column → cell,
// with kubectl's "<none>" and stoke's "-" both as "-".
func table(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a header and one row, got:\n%s", out)
	}
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	if len(head) != len(row) {
		t.Fatalf("%d columns, %d cells:\n%s", len(head), len(row), out)
	}
	cells := make(map[string]string, len(head))
	for i, h := range head {
		if row[i] == "<none>" {
			row[i] = "-"
		}
		cells[h] = row[i]
	}
	if slices.Contains(head, "") {
		t.Fatalf("empty header in:\n%s", out)
	}
	return cells
}
