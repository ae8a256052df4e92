package validation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// fullTemplate sets every field of a Runtime's template, as a platform
// team would.
func fullTemplate() *v1alpha1.RuntimeTemplate {
	return &v1alpha1.RuntimeTemplate{
		Image:           "registry.example.com/ml/python-torch:1.4",
		ImagePullPolicy: corev1.PullAlways,
		Resources: &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
		},
		Env: []corev1.EnvVar{
			{Name: "PYTHONPATH", Value: "/opt/lib"},
			{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token",
			}}},
		},
		Volumes: []corev1.Volume{{Name: "models", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "models"}},
		}}},
		VolumeMounts: []corev1.VolumeMount{{Name: "models", MountPath: "/models", ReadOnly: true}},
		NodeSelector: map[string]string{"pool": "ml"},
		Tolerations:  []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/arch", Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"},
			}}}},
		}}},
		PriorityClassName:  "batch-high",
		ImagePullSecrets:   []corev1.LocalObjectReference{{Name: "regcred"}},
		ServiceAccountName: "reader",
		// As the default is: stated so that every field is set.
		AutomountServiceAccountToken: new(true),
	}
}

// withTemplate returns a mutation that sets a full template, then edit.
func withTemplate(edit func(*v1alpha1.RuntimeTemplate)) func(*v1alpha1.Runtime) {
	return func(rt *v1alpha1.Runtime) {
		rt.Spec.Template = fullTemplate()
		edit(rt.Spec.Template)
	}
}

// templateCases are the templates that would break the runtime Pod, each
// refused at the field that says why; runtimeCases holds them, so that
// the CRD test holds the API server to the same answers.
var templateCases = []runtimeCase{
	{"template full", withTemplate(func(*v1alpha1.RuntimeTemplate) {}), ""},
	{"template env only", func(rt *v1alpha1.Runtime) {
		rt.Spec.Template = &v1alpha1.RuntimeTemplate{Env: []corev1.EnvVar{{Name: "PYTHONPATH", Value: "/opt/lib"}}}
	}, ""},
	{"template env POD_IP", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Env = append(t.Env, corev1.EnvVar{Name: "POD_IP", Value: "1.2.3.4"})
	}), "spec.template.env"},
	{"template env STOKE_", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Env = append(t.Env, corev1.EnvVar{Name: "STOKE_OUTPUTS", Value: "/tmp/x"})
	}), "spec.template.env"},
	{"template env name", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Env = append(t.Env, corev1.EnvVar{Name: "A-B", Value: "x"})
	}), "spec.template.env"},
	{"template env duplicate", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Env = append(t.Env, corev1.EnvVar{Name: "PYTHONPATH", Value: "/x"})
	}), "spec.template.env[2].name"},
	{"template volume workspace", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Volumes = append(t.Volumes, corev1.Volume{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}), "spec.template.volumes"},
	{"template volume run", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.Volumes[0].Name = "run"
		t.VolumeMounts[0].Name = "run"
	}), "spec.template.volumes"},
	{"template volumes 33", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.VolumeMounts = nil
		t.Volumes = nil
		for i := range 33 {
			t.Volumes = append(t.Volumes, corev1.Volume{Name: "v" + strings.Repeat("x", i), VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		}
	}), "spec.template.volumes"},
	{"template mount at /workspace", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.VolumeMounts[0].MountPath = "/workspace" }), "spec.template.volumeMounts"},
	{"template mount beneath the socket directory", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.VolumeMounts[0].MountPath = "/var/run/stoke/rs.sock"
	}), "spec.template.volumeMounts"},
	{"template mount over stoke-bin", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.VolumeMounts[0].MountPath = "/var/run/stoke-bin" }), "spec.template.volumeMounts"},
	{"template mount beside Stoke's", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.VolumeMounts[0].MountPath = "/var/run/stoke-models" }), ""},
	{"template mount of no volume", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.VolumeMounts[0].Name = "nope" }), "spec.template.volumeMounts"},
	{"template pull policy", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.ImagePullPolicy = "Sometimes" }), "spec.template.imagePullPolicy"},
	{"template service account without a token", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.ServiceAccountName, t.AutomountServiceAccountToken = "reader", new(false)
	}), ""},
	{"template service account stoke-runtimed", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.ServiceAccountName = "stoke-runtimed" }), "spec.template.serviceAccountName"},
	{"template service account stoke-controller", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.ServiceAccountName = "stoke-controller" }), "spec.template.serviceAccountName"},
	{"template service account name", withTemplate(func(t *v1alpha1.RuntimeTemplate) { t.ServiceAccountName = "Not_A_Name" }), "spec.template.serviceAccountName"},
	{"template token without a service account", withTemplate(func(t *v1alpha1.RuntimeTemplate) {
		t.ServiceAccountName, t.AutomountServiceAccountToken = "", new(true)
	}), "spec.template.automountServiceAccountToken"},
}

func init() { runtimeCases = append(runtimeCases, templateCases...) }

func TestValidateStandaloneRuntime(t *testing.T) {
	rt := validRuntime()
	if err := ValidateStandaloneRuntime(rt); err != nil {
		t.Fatalf("a Runtime without a template: %v", err)
	}
	rt.Spec.Template = &v1alpha1.RuntimeTemplate{Env: []corev1.EnvVar{{Name: "PYTHONPATH", Value: "/opt/lib"}}}
	if err := ValidateStandaloneRuntime(rt); err != nil {
		t.Fatalf("a template of env alone: %v", err)
	}
	rt.Spec.Template = fullTemplate()
	if err := ValidateRuntime(rt); err != nil {
		t.Fatalf("the full template: %v", err)
	}
	err := ValidateStandaloneRuntime(rt)
	if err == nil {
		t.Fatal("stoke up takes a template with an image, a nodeSelector, …")
	}
	msg := err.Error()
	for _, f := range []string{"image", "imagePullPolicy", "resources", "volumes", "volumeMounts", "nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets", "serviceAccountName", "env[1].valueFrom"} {
		if !strings.Contains(msg, "spec.template."+f+": ") {
			t.Errorf("no problem named at spec.template.%s in:\n%s", f, msg)
		}
	}
	if !strings.Contains(msg, "only in Kubernetes mode") {
		t.Errorf("the message does not say why:\n%s", msg)
	}
	rt = validRuntime()
	rt.Spec.Git = &v1alpha1.RuntimeGit{CredentialsSecret: "git-creds"}
	if err := ValidateStandaloneRuntime(rt); err == nil || !strings.Contains(err.Error(), "spec.git.credentialsSecret: ") || !strings.Contains(err.Error(), "--git-credentials") {
		t.Errorf("stoke up and spec.git.credentialsSecret: %v", err)
	}
}
