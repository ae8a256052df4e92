package functionset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// template is what a replica is made from: a change of any of it rolls the
// replicas; scale, queue, replicas and drainSeconds do not.
type template struct {
	Runtime string            `json:"runtime"`
	Handler string            `json:"handler"`
	Source  *v1alpha1.Source  `json:"source,omitempty"`
	Env     []v1alpha1.EnvVar `json:"env,omitempty"`
	Timeout *metav1.Duration  `json:"timeout,omitempty"`
}

// TemplateHash is the value of v1alpha1.LabelTemplateHash for replicas of
// fn's current template: 10 hex digits of the SHA-256 of its JSON.
func TemplateHash(fn *v1alpha1.Function) string {
	s := &fn.Spec
	b, err := json.Marshal(template{Runtime: s.Runtime, Handler: s.Handler, Source: s.Source, Env: s.Env, Timeout: s.Timeout})
	if err != nil {
		// Only unencodable values fail, which a Function's spec has none of.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:5])
}

// Replica returns a new replica Run of fn's current template, named by
// generateName NAME-HASH-. It is created carrying runtimed's finalizer
// (v1alpha1.FinalizerRuntimed), which runtimed would otherwise write after
// its claim, one API write in series before the replica is Ready (a scale
// from zero waits for it); a replica deleted before any runtimed held it
// loses the finalizer to the reaper, so its delete never hangs.
func Replica(fn *v1alpha1.Function, hash string) *v1alpha1.Run {
	s := &fn.Spec
	run := &v1alpha1.Run{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    fn.Namespace,
			GenerateName: fn.Name + "-" + hash + "-",
			Labels:       map[string]string{v1alpha1.LabelFunction: fn.Name, v1alpha1.LabelTemplateHash: hash},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindFunction,
				Name: fn.Name, UID: fn.UID, Controller: ptr(true),
			}},
			Finalizers: []string{v1alpha1.FinalizerRuntimed},
		},
		Spec: v1alpha1.RunSpec{
			Runtime: s.Runtime,
			Mode:    v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: s.Handler}},
			Source:  s.Source.DeepCopy(),
			Env:     append([]v1alpha1.EnvVar(nil), s.Env...),
			Timeout: s.Timeout.DeepCopy(),
			// One attempt: a replica that dies is replaced by this
			// controller, with its back-off.
			RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 1},
		},
	}
	return run
}

// Selector is the label selector of fn's replicas, for the scale
// subresource.
func Selector(name string) string { return v1alpha1.LabelFunction + "=" + name }

// OwnedBy reports whether run is a replica of the Function with this UID.
func OwnedBy(run *v1alpha1.Run, uid string) bool {
	for _, o := range run.OwnerReferences {
		if o.Kind == v1alpha1.KindFunction && string(o.UID) == uid && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
