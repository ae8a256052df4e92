package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// env is a container's environment in order, with lookups for $(VAR).
type env struct {
	names []string
	vals  map[string]string
}

func (e *env) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *env) get(k string) (string, bool) { v, ok := e.vals[k]; return v, ok }

func (e *env) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// containerEnv builds c's environment as the kubelet does: the image's
// (here the agent's base environment), the service variables of the
// "kubernetes" Service (so that client-go's in-cluster config finds the
// API server), envFrom, then env in order, each value expanded with the
// variables defined before it.
func (w *podWorker) containerEnv(ctx context.Context, c *corev1.Container, imageBin string, imageEnv []string) (*env, error) {
	pod := w.pod
	e := &env{vals: map[string]string{}}
	for _, kv := range append(slices.Clip(w.a.cfg.BaseEnv), imageEnv...) {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	// A binary image's program is on its PATH, first.
	if path, ok := e.get("PATH"); imageBin != "" && ok && path != "" {
		e.set("PATH", imageBin+":"+path)
	} else if imageBin != "" {
		e.set("PATH", imageBin)
	}
	e.set("HOSTNAME", pod.Name)
	host, port := w.a.apiHost, w.a.apiPort
	e.set("KUBERNETES_SERVICE_HOST", host)
	e.set("KUBERNETES_SERVICE_PORT", port)
	e.set("KUBERNETES_SERVICE_PORT_HTTPS", port)
	for _, from := range c.EnvFrom {
		data, err := w.envFromSource(ctx, from)
		if err != nil {
			return nil, err
		}
		for k, v := range data {
			e.set(from.Prefix+k, v)
		}
	}
	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			e.set(ev.Name, expand(ev.Value, e.get))
			continue
		}
		v, ok, err := w.envValueFrom(ctx, ev.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", ev.Name, err)
		}
		if ok {
			e.set(ev.Name, v)
		}
	}
	return e, nil
}

func (w *podWorker) envFromSource(ctx context.Context, from corev1.EnvFromSource) (map[string]string, error) {
	ns := w.pod.Namespace
	switch {
	case from.ConfigMapRef != nil:
		cm, err := w.a.client.CoreV1().ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(from.ConfigMapRef.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom configMap %s: %w", from.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := w.a.client.CoreV1().Secrets(ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(from.SecretRef.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom secret %s: %w", from.SecretRef.Name, err)
		}
		out := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, nil
}

func optional(b *bool) bool { return b != nil && *b }

// envValueFrom resolves valueFrom; ok is false for an optional key that
// is missing (the variable is then not set).
func (w *podWorker) envValueFrom(ctx context.Context, from *corev1.EnvVarSource) (v string, ok bool, err error) {
	ns := w.pod.Namespace
	switch {
	case from.FieldRef != nil:
		v, err := w.fieldValue(from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := w.a.client.CoreV1().Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(ref.Optional) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("secret %s: %w", ref.Name, err)
		}
		b, found := s.Data[ref.Key]
		if !found {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
		}
		return string(b), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := w.a.client.CoreV1().ConfigMaps(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(ref.Optional) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("configMap %s: %w", ref.Name, err)
		}
		s, found := cm.Data[ref.Key]
		if !found {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configMap %s has no key %q", ref.Name, ref.Key)
		}
		return s, true, nil
	}
	return "", false, fmt.Errorf("valueFrom: only fieldRef, secretKeyRef and configMapKeyRef are modelled by the node agent")
}

// fieldValue is the downward API's value of a Pod field.
func (w *podWorker) fieldValue(path string) (string, error) {
	pod := w.pod
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return w.ip.String(), nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	return "", fmt.Errorf("fieldRef %q is not modelled by the node agent", path)
}
