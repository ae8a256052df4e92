package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// defaultFileMode is the API's default for secret, configMap, projected
// and downward API files (0644).
const defaultFileMode = 0o644

// setUpVolumes materialises the Pod's volumes under its directory, once,
// before its first container starts: later changes to a Secret or
// ConfigMap are not propagated, and tokens are not refreshed.
func (w *podWorker) setUpVolumes(ctx context.Context) error {
	w.volumes = map[string]string{}
	for _, v := range w.pod.Spec.Volumes {
		dir := filepath.Join(w.dir, "volumes", v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = os.MkdirAll(dir, 0o700)
		case v.HostPath != nil:
			dir = v.HostPath.Path
			err = hostPath(v.HostPath)
		case v.Secret != nil:
			err = w.writeFiles(ctx, dir, []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: v.Secret.SecretName},
				Items:                v.Secret.Items, Optional: v.Secret.Optional,
			}}}, v.Secret.DefaultMode)
		case v.ConfigMap != nil:
			err = w.writeFiles(ctx, dir, []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: v.ConfigMap.LocalObjectReference,
				Items:                v.ConfigMap.Items, Optional: v.ConfigMap.Optional,
			}}}, v.ConfigMap.DefaultMode)
		case v.DownwardAPI != nil:
			err = w.writeFiles(ctx, dir, []corev1.VolumeProjection{{DownwardAPI: &corev1.DownwardAPIProjection{
				Items: v.DownwardAPI.Items,
			}}}, v.DownwardAPI.DefaultMode)
		case v.Projected != nil:
			err = w.writeFiles(ctx, dir, v.Projected.Sources, v.Projected.DefaultMode)
		default:
			err = fmt.Errorf("its type is not modelled by the node agent (emptyDir, hostPath, secret, configMap, downwardAPI and projected are)")
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
		w.volumes[v.Name] = dir
	}
	return nil
}

// hostPath makes a hostPath volume's path if its type says so.
func hostPath(h *corev1.HostPathVolumeSource) error {
	switch ptr.Deref(h.Type, corev1.HostPathUnset) {
	case corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(h.Path, 0o755)
	case corev1.HostPathFileOrCreate:
		f, err := os.OpenFile(h.Path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	if _, err := os.Stat(h.Path); err != nil {
		return fmt.Errorf("hostPath: %w", err)
	}
	return nil
}

// writeFiles writes the projections' files into dir.
func (w *podWorker) writeFiles(ctx context.Context, dir string, sources []corev1.VolumeProjection, defaultMode *int32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mode := int32(defaultFileMode)
	if defaultMode != nil {
		mode = *defaultMode
	}
	files := map[string][]byte{}
	modes := map[string]int32{}
	put := func(path string, data []byte, m *int32) {
		files[path] = data
		modes[path] = mode
		if m != nil {
			modes[path] = *m
		}
	}
	ns := w.pod.Namespace
	for _, src := range sources {
		switch {
		case src.Secret != nil:
			s, err := w.a.client.CoreV1().Secrets(ns).Get(ctx, src.Secret.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && optional(src.Secret.Optional) {
				continue
			}
			if err != nil {
				return fmt.Errorf("secret %s: %w", src.Secret.Name, err)
			}
			if err := project(s.Data, src.Secret.Items, optional(src.Secret.Optional), put); err != nil {
				return fmt.Errorf("secret %s: %w", src.Secret.Name, err)
			}
		case src.ConfigMap != nil:
			cm, err := w.a.client.CoreV1().ConfigMaps(ns).Get(ctx, src.ConfigMap.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && optional(src.ConfigMap.Optional) {
				continue
			}
			if err != nil {
				return fmt.Errorf("configMap %s: %w", src.ConfigMap.Name, err)
			}
			data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			for k, v := range cm.BinaryData {
				data[k] = v
			}
			if err := project(data, src.ConfigMap.Items, optional(src.ConfigMap.Optional), put); err != nil {
				return fmt.Errorf("configMap %s: %w", src.ConfigMap.Name, err)
			}
		case src.DownwardAPI != nil:
			for _, it := range src.DownwardAPI.Items {
				if it.FieldRef == nil {
					return fmt.Errorf("downwardAPI %s: only fieldRef is modelled by the node agent", it.Path)
				}
				v, err := w.fieldValue(it.FieldRef.FieldPath)
				if err != nil {
					return err
				}
				put(it.Path, []byte(v), it.Mode)
			}
		case src.ServiceAccountToken != nil:
			tok, err := w.token(ctx, src.ServiceAccountToken)
			if err != nil {
				return err
			}
			put(src.ServiceAccountToken.Path, []byte(tok), nil)
		default:
			return fmt.Errorf("a projected source other than secret, configMap, downwardAPI and serviceAccountToken is not modelled by the node agent")
		}
	}
	for path, data := range files {
		p := filepath.Join(dir, path)
		if !filepath.IsLocal(path) {
			return fmt.Errorf("file path %q leaves the volume", path)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, os.FileMode(modes[path]&0o777)); err != nil {
			return err
		}
		if err := os.Chmod(p, os.FileMode(modes[path]&0o777)); err != nil {
			return err
		}
	}
	return nil
}

// project selects a Secret's or ConfigMap's keys as files.
func project(data map[string][]byte, items []corev1.KeyToPath, opt bool, put func(string, []byte, *int32)) error {
	if len(items) == 0 {
		for k, v := range data {
			put(k, v, nil)
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if opt {
				continue
			}
			return fmt.Errorf("no key %q", it.Key)
		}
		put(it.Path, v, it.Mode)
	}
	return nil
}

// token asks for a token of the Pod's ServiceAccount bound to the Pod, as
// the kubelet's projected serviceAccountToken does (TokenRequest with the
// Pod as the bound object; no audience means the API server's).
func (w *podWorker) token(ctx context.Context, p *corev1.ServiceAccountTokenProjection) (string, error) {
	sa := w.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: p.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: w.pod.Name, UID: w.pod.UID,
		},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	tr, err := w.a.client.CoreV1().ServiceAccounts(w.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %s/%s: %w", w.pod.Namespace, sa, err)
	}
	return tr.Status.Token, nil
}

// mounts lists c's volume mounts for the init, parents first.
func (w *podWorker) mounts(c *corev1.Container) ([]mountSpec, error) {
	var out []mountSpec
	for _, m := range c.VolumeMounts {
		src, ok := w.volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %q: no such volume", m.Name)
		}
		if m.SubPath != "" {
			if !filepath.IsLocal(m.SubPath) {
				return nil, fmt.Errorf("volumeMount %q: subPath %q leaves the volume", m.Name, m.SubPath)
			}
			src = filepath.Join(src, m.SubPath)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, err
				}
			}
		}
		ro := m.ReadOnly
		if v := w.volume(m.Name); v != nil && (v.Secret != nil || v.ConfigMap != nil || v.Projected != nil || v.DownwardAPI != nil) {
			ro = true // the kubelet mounts these read-only whatever the mount says
		}
		out = append(out, mountSpec{Source: src, Target: filepath.Clean("/" + m.MountPath), ReadOnly: ro})
	}
	sortMounts(out)
	return out, nil
}

func (w *podWorker) volume(name string) *corev1.Volume {
	for i := range w.pod.Spec.Volumes {
		if w.pod.Spec.Volumes[i].Name == name {
			return &w.pod.Spec.Volumes[i]
		}
	}
	return nil
}

// sortMounts orders mounts so that one inside another comes after it.
func sortMounts(ms []mountSpec) {
	depth := func(p string) int { return strings.Count(p, "/") }
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && depth(ms[j].Target) < depth(ms[j-1].Target); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}
