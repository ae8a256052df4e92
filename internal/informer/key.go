package informer

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Key names an object within its kind.
type Key struct {
	Namespace, Name string
}

// KeyOf returns obj's key; an empty namespace is store.DefaultNamespace.
func KeyOf(obj metav1.Object) Key {
	return Key{Namespace: defaultNamespace(obj.GetNamespace()), Name: obj.GetName()}
}

// String returns "namespace/name".
func (k Key) String() string { return k.Namespace + "/" + k.Name }
