package validation

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// Bounds of a Runtime's template that are the template's own: enough for
// any Pod a platform team writes, small enough for the CRD's CEL budget.
const (
	maxTemplateVolumes = 32 // volumes, volumeMounts
	maxTemplateList    = 32 // tolerations, imagePullSecrets
	maxPriorityClass   = 253
	// maxServiceAccountName is a ServiceAccount name's (a DNS subdomain).
	maxServiceAccountName = 253
)

var pullPolicies = []corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}

// validateTemplate checks spec.template with the rules its CRD states in
// CEL: nothing in it may take the runtime Pod's own volumes, their paths
// or the variables Stoke sets, and every mount is of a template volume.
// What only the Pod's own validation knows (a volume's source, a
// resource quantity's sense) the API server checks when the controller
// writes the Deployment.
func validateTemplate(e *errorList, t *v1alpha1.RuntimeTemplate, p *field.Path) {
	if t == nil {
		return
	}
	if len(t.Image) > bounds.Path {
		e.add(p.Child("image"), "is %d bytes, at most %d allowed", len(t.Image), bounds.Path)
	}
	if t.ImagePullPolicy != "" && !slices.Contains(pullPolicies, t.ImagePullPolicy) {
		e.add(p.Child("imagePullPolicy"), "%s, want Always, IfNotPresent or Never", quote(string(t.ImagePullPolicy)))
	}
	validateTemplateEnv(e, t.Env, p.Child("env"))
	volumes := p.Child("volumes")
	names := map[string]bool{}
	switch {
	case len(t.Volumes) > maxTemplateVolumes:
		e.add(volumes, "has %d entries, at most %d allowed", len(t.Volumes), maxTemplateVolumes)
	default:
		for i, v := range t.Volumes {
			if slices.Contains(v1alpha1.ReservedVolumes, v.Name) {
				e.add(volumes, "%s (%s): %s are the runtime Pod's own volumes", quote(v.Name), volumes.Index(i), strings.Join(v1alpha1.ReservedVolumes, ", "))
			}
			if names[v.Name] {
				e.add(volumes.Index(i).Child("name"), "%s is a duplicate", quote(v.Name))
			}
			names[v.Name] = true
		}
	}
	mounts := p.Child("volumeMounts")
	switch {
	case len(t.VolumeMounts) > maxTemplateVolumes:
		e.add(mounts, "has %d entries, at most %d allowed", len(t.VolumeMounts), maxTemplateVolumes)
	default:
		for i, m := range t.VolumeMounts {
			if r, ok := reservedPath(m.MountPath); ok {
				e.add(mounts, "%s (%s) is, or is beneath, the runtime Pod's own %s", quote(m.MountPath), mounts.Index(i), r)
			}
			if !names[m.Name] {
				e.add(mounts, "%s (%s) is no volume of %s", quote(m.Name), mounts.Index(i), volumes)
			}
		}
	}
	if len(t.Tolerations) > maxTemplateList {
		e.add(p.Child("tolerations"), "has %d entries, at most %d allowed", len(t.Tolerations), maxTemplateList)
	}
	if len(t.ImagePullSecrets) > maxTemplateList {
		e.add(p.Child("imagePullSecrets"), "has %d entries, at most %d allowed", len(t.ImagePullSecrets), maxTemplateList)
	}
	if len(t.PriorityClassName) > maxPriorityClass {
		e.add(p.Child("priorityClassName"), "is %d bytes, at most %d allowed", len(t.PriorityClassName), maxPriorityClass)
	}
	validateTemplateServiceAccount(e, t, p)
}

// validateTemplateServiceAccount checks the runtime-server container's
// ServiceAccount: a name of the namespace's, never one of Stoke's own
// (users' code must not have runtimed's identity, nor the chart's), and
// no token asked for without one.
func validateTemplateServiceAccount(e *errorList, t *v1alpha1.RuntimeTemplate, p *field.Path) {
	sa := p.Child("serviceAccountName")
	if len(t.ServiceAccountName) > maxServiceAccountName {
		e.add(sa, "is %d bytes, at most %d allowed", len(t.ServiceAccountName), maxServiceAccountName)
	} else if t.ServiceAccountName != "" {
		for _, msg := range k8svalidation.IsDNS1123Subdomain(t.ServiceAccountName) {
			e.add(sa, "%s: %s", quote(t.ServiceAccountName), msg)
		}
		if slices.Contains(v1alpha1.ReservedServiceAccounts, t.ServiceAccountName) {
			e.add(sa, "%s: %s are Stoke's own ServiceAccounts: users' code may not have their identity", quote(t.ServiceAccountName), strings.Join(v1alpha1.ReservedServiceAccounts, ", "))
		}
	}
	if a := t.AutomountServiceAccountToken; a != nil && *a && t.ServiceAccountName == "" {
		e.add(p.Child("automountServiceAccountToken"), "needs a serviceAccountName: the runtime-server container gets no token but its template's ServiceAccount's")
	}
}

// validateTemplateEnv checks the template's env: the names a handler's
// env can carry, unique, none of Stoke's own.
func validateTemplateEnv(e *errorList, env []corev1.EnvVar, p *field.Path) {
	if len(env) > bounds.EnvEntries {
		e.add(p, "has %d entries, at most %d allowed", len(env), bounds.EnvEntries)
		return
	}
	seen := map[string]bool{}
	for i, v := range env {
		switch {
		case !envKeyRE.MatchString(v.Name):
			e.add(p, "%s (%s): names must match [A-Za-z_][A-Za-z0-9_]*", quote(v.Name), p.Index(i))
		case slices.Contains(v1alpha1.ReservedEnv, v.Name) || strings.HasPrefix(v.Name, v1alpha1.ReservedEnvPrefix):
			e.add(p, "%s (%s): %s and %s* are Stoke's own variables", quote(v.Name), p.Index(i), strings.Join(v1alpha1.ReservedEnv, ", "), v1alpha1.ReservedEnvPrefix)
		case seen[v.Name]:
			e.add(p.Index(i).Child("name"), "%s is a duplicate", quote(v.Name))
		case strings.IndexByte(v.Value, 0) >= 0:
			e.add(p.Index(i).Child("value"), "contains a NUL byte")
		}
		seen[v.Name] = true
	}
}

// reservedPath reports the runtime Pod's own path that path is or lies
// beneath, if any.
func reservedPath(path string) (string, bool) {
	for _, r := range v1alpha1.ReservedMountPaths {
		if path == r || strings.HasPrefix(path, r+"/") {
			return r, true
		}
	}
	return "", false
}

// ValidateStandaloneRuntime checks what standalone (stoke up) can do with
// a Runtime that ValidateRuntime accepted: of spec.template only env with
// plain values applies, as the pods are local processes of stoke up's own
// binary. The rest is refused, naming the field, rather than ignored: a
// platform team's nodeSelector or image that silently did nothing would be
// a worse surprise than an error.
func ValidateStandaloneRuntime(rt *v1alpha1.Runtime) error {
	var e errorList
	if g := rt.Spec.Git; g != nil && g.CredentialsSecret != "" {
		e.add(field.NewPath("spec", "git", "credentialsSecret"), "applies only in Kubernetes mode; stoke up takes git credentials from its --git-credentials file")
	}
	t := rt.Spec.Template
	if t == nil {
		return e.err()
	}
	p := field.NewPath("spec", "template")
	only := "applies only in Kubernetes mode; stoke up runs pods as local processes and takes only spec.template.env"
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"image", t.Image != ""},
		{"imagePullPolicy", t.ImagePullPolicy != ""},
		{"resources", t.Resources != nil},
		{"volumes", len(t.Volumes) > 0},
		{"volumeMounts", len(t.VolumeMounts) > 0},
		{"nodeSelector", len(t.NodeSelector) > 0},
		{"tolerations", len(t.Tolerations) > 0},
		{"affinity", t.Affinity != nil},
		{"priorityClassName", t.PriorityClassName != ""},
		{"imagePullSecrets", len(t.ImagePullSecrets) > 0},
		{"serviceAccountName", t.ServiceAccountName != ""},
		{"automountServiceAccountToken", t.AutomountServiceAccountToken != nil},
	} {
		if f.set {
			e.add(p.Child(f.name), "%s", only)
		}
	}
	for i, v := range t.Env {
		if v.ValueFrom != nil {
			e.add(p.Child("env").Index(i).Child("valueFrom"), "applies only in Kubernetes mode (Secrets, ConfigMaps, the downward API); give %s a value", quote(v.Name))
		}
	}
	return e.err()
}
