package runtimeset

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/pki"
)

func runtimeObj(name, server string, replicas, runs int32) *v1alpha1.Runtime {
	return &v1alpha1.Runtime{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.RuntimeSpec{Server: server, Replicas: replicas, Runs: runs},
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no container %q", name)
	}
	return spec.Containers[i]
}

func mounts(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, vm := range c.VolumeMounts {
		m[vm.Name] = vm.MountPath
	}
	return m
}

func TestDeploymentFollowsThePodConventions(t *testing.T) {
	rt := runtimeObj("py", "python", 3, 4)
	rt.Spec.DefaultInvokeTimeout = &metav1.Duration{Duration: 7 * time.Second}
	rt.Spec.DefaultTaskTimeout = &metav1.Duration{Duration: time.Minute}
	d := Deployment(rt, Options{Image: "stoke:test"})
	if d.Namespace != "team-a" || d.Name != "py" || *d.Spec.Replicas != 3 {
		t.Fatalf("deployment %s/%s replicas %d", d.Namespace, d.Name, *d.Spec.Replicas)
	}
	want := map[string]string{LabelRuntime: "py", LabelName: NameRuntimePod}
	for _, l := range []map[string]string{d.Spec.Selector.MatchLabels, d.Spec.Template.Labels} {
		for k, v := range want {
			if l[k] != v {
				t.Errorf("label %s = %q, want %q", k, l[k], v)
			}
		}
	}
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != ServiceAccount || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("service account %q, automount %v: want %s mounted by hand in runtimed only", spec.ServiceAccountName, spec.AutomountServiceAccountToken, ServiceAccount)
	}
	rs, rd := container(t, spec, ContainerRuntimeServer), container(t, spec, ContainerRuntimed)
	if got := strings.Join(rs.Args, " "); got != "runtime-server --runtime python --listen unix:///var/run/stoke/rs.sock --workspace-root /workspace --debug-socket /var/run/stoke/runtime-server/debug.sock --run-log-dir /workspace/.stoke-run-logs --python-deps /workspace/.stoke-pydeps --default-invoke-timeout 7s" {
		t.Errorf("runtime-server args: %s", got)
	}
	if got := strings.Join(rd.Args, " "); !strings.Contains(got, "--listen $(POD_IP):7443") || !strings.Contains(got, "--tls-dir /var/run/stoke-tls") || !strings.Contains(got, "--default-task-timeout 1m0s") || !strings.Contains(got, "--debug-socket /var/run/stoke/runtimed/debug.sock") || !strings.Contains(got, "--run-log-dir "+RunLogDir) {
		t.Errorf("runtimed args: %s", got)
	}
	for _, c := range []corev1.Container{rs, rd} {
		if c.Image != "stoke:test" {
			t.Errorf("%s image %q", c.Name, c.Image)
		}
		m := mounts(c)
		if m[volumeRun] != "/var/run/stoke" || m[volumeWorkspace] != "/workspace" {
			t.Errorf("%s mounts %v", c.Name, m)
		}
		var env []string
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
				t.Errorf("%s env %s is not from the downward API", c.Name, e.Name)
				continue
			}
			env = append(env, e.Name+"="+e.ValueFrom.FieldRef.FieldPath)
		}
		if got := strings.Join(env, ","); got != "POD_NAME=metadata.name,POD_NAMESPACE=metadata.namespace,POD_UID=metadata.uid,POD_IP=status.podIP" {
			t.Errorf("%s env %s", c.Name, got)
		}
	}
	if m := mounts(rs); m[volumeTLS] != "" || m[volumeToken] != "" {
		t.Errorf("runtime-server, which runs users' code, mounts %v", m)
	}
	if m := mounts(rd); m[volumeTLS] != TLSDir || m[volumeToken] != tokenDir {
		t.Errorf("runtimed mounts %v", m)
	}
	if rd.ReadinessProbe == nil || rd.ReadinessProbe.Exec == nil || strings.Join(rd.ReadinessProbe.Exec.Command, " ") != "stoke runtimed probe --probe-socket /var/run/stoke/runtimed/probe.sock" {
		t.Errorf("runtimed readiness probe %+v", rd.ReadinessProbe)
	}
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeTLS })
	if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != pki.RuntimedSecret {
		t.Errorf("no volume of Secret %s", pki.RuntimedSecret)
	}
}

func TestDeploymentHashFollowsTheSpec(t *testing.T) {
	rt := runtimeObj("sh", "bash", 2, 4)
	h := Deployment(rt, Options{}).Annotations[AnnotationTemplateHash]
	if h == "" || h != Deployment(rt, Options{}).Annotations[AnnotationTemplateHash] {
		t.Fatal("the hash of one spec is not stable")
	}
	rt.Spec.Replicas = 3
	if Deployment(rt, Options{}).Annotations[AnnotationTemplateHash] == h {
		t.Fatal("a replicas change keeps the hash")
	}
	// spec.runs is not in the Pods: the scheduler reads it from the
	// Runtime, and changing it restarts nothing.
	rt.Spec.Replicas = 2
	rt.Spec.Runs = 8
	if Deployment(rt, Options{}).Annotations[AnnotationTemplateHash] != h {
		t.Fatal("a runs change changes the Pods")
	}
}

func TestLambdaFieldsBecomeFlags(t *testing.T) {
	rt := runtimeObj("fn", "lambda", 1, 10)
	rt.Spec.Lambda = &v1alpha1.LambdaSpec{Runtime: "python", Role: "arn:aws:iam::1:role/x", Architecture: "arm64", MemoryMB: 256, NamePrefix: "t-", Bootstrap: "/opt/stoke-arm64"}
	args := strings.Join(container(t, Deployment(rt, Options{}).Spec.Template.Spec, ContainerRuntimeServer).Args, " ")
	want := "--runtime lambda --listen unix:///var/run/stoke/rs.sock --workspace-root /workspace --debug-socket /var/run/stoke/runtime-server/debug.sock --run-log-dir /workspace/.stoke-run-logs --lambda-runtime python --lambda-role arn:aws:iam::1:role/x --lambda-architecture arm64 --lambda-memory 256 --lambda-name-prefix t- --lambda-bootstrap /opt/stoke-arm64"
	if !strings.HasSuffix(args, want) {
		t.Fatalf("args %q, want ending %q", args, want)
	}
	rt.Spec.Lambda.Bootstrap, rt.Spec.Lambda.Image = "", "1.dkr.ecr.eu-west-1.amazonaws.com/fn:1"
	args = strings.Join(container(t, Deployment(rt, Options{}).Spec.Template.Spec, ContainerRuntimeServer).Args, " ")
	if !strings.HasSuffix(args, "--lambda-name-prefix t- --lambda-image 1.dkr.ecr.eu-west-1.amazonaws.com/fn:1") {
		t.Fatalf("args %q, want ending with --lambda-image", args)
	}
}

func TestStatusCountsReadyPodsAndFreeSlots(t *testing.T) {
	rt := runtimeObj("sh", "bash", 3, 4)
	pod := func(name string, ready bool) corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{LabelRuntime: "sh"}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.9", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
		}
	}
	run := func(podName string, phase v1alpha1.Phase) *v1alpha1.Run {
		return &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "sh"}, Status: v1alpha1.RunStatus{Phase: phase, AssignedPodUID: "uid-" + podName}}
	}
	deleting := pod("d", true)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	pods := []corev1.Pod{pod("b", true), pod("a", true), pod("c", false), deleting}
	runs := []*v1alpha1.Run{
		run("a", v1alpha1.PhaseRunning), run("a", v1alpha1.PhaseReady), run("a", v1alpha1.PhaseScheduled),
		run("a", v1alpha1.PhaseSucceeded), // holds nothing
		run("b", v1alpha1.PhaseReady),
		run("c", v1alpha1.PhaseRunning), // on a pod that is not ready
	}
	// Five Runs on pod b: more than its slots, which counts as none free.
	over := []*v1alpha1.Run{run("b", v1alpha1.PhaseRunning), run("b", v1alpha1.PhaseRunning), run("b", v1alpha1.PhaseRunning), run("b", v1alpha1.PhaseRunning)}
	st := Status(rt, pods, runs)
	if st.ReadyPods != 2 || st.FreeSlots != (4-3)+(4-1) {
		t.Fatalf("ready %d free %d, want 2 and 4", st.ReadyPods, st.FreeSlots)
	}
	if len(st.Pods) != 4 || st.Pods[0].Name != "a" || !st.Pods[0].Ready || st.Pods[2].Ready || st.Pods[0].Address != "127.0.0.9:7443" {
		t.Fatalf("pods %+v", st.Pods)
	}
	if st := Status(rt, pods, append(runs, over...)); st.FreeSlots != 1 {
		t.Fatalf("free %d with pod b over-full, want 1 (pod a's)", st.FreeSlots)
	}
}

// TestDeploymentWearsTheTemplate puts a platform team's template on the
// Pods: the user's image in the runtime-server container with Stoke's
// binary from an init container of Stoke's image, the template's env,
// resources and mounts there only, the Pod's scheduling and volumes; and
// runtimed unchanged, on Stoke's image with the only token.
func TestDeploymentWearsTheTemplate(t *testing.T) {
	rt := runtimeObj("ml", "python", 2, 4)
	before := Deployment(rt, Options{Image: "stoke:1"})
	cpu := resource.MustParse("500m")
	rt.Spec.Template = &v1alpha1.RuntimeTemplate{
		Image:     "registry.example.com/ml:1",
		Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: cpu}},
		Env: []corev1.EnvVar{{Name: "PYTHONPATH", Value: "/opt/lib"}, {Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}},
		Volumes:           []corev1.Volume{{Name: "models", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		VolumeMounts:      []corev1.VolumeMount{{Name: "models", MountPath: "/models"}},
		NodeSelector:      map[string]string{"pool": "ml"},
		Tolerations:       []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}},
		Affinity:          &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{}},
		PriorityClassName: "high",
		ImagePullSecrets:  []corev1.LocalObjectReference{{Name: "regcred"}},
	}
	d := Deployment(rt, Options{Image: "stoke:1"})
	if d.Annotations[AnnotationTemplateHash] == before.Annotations[AnnotationTemplateHash] {
		t.Fatal("a template keeps the hash: the Deployment would not roll")
	}
	spec := d.Spec.Template.Spec
	rs, rd := container(t, spec, ContainerRuntimeServer), container(t, spec, ContainerRuntimed)
	if rs.Image != "registry.example.com/ml:1" || strings.Join(rs.Command, " ") != BinDir+"/stoke" {
		t.Errorf("runtime-server image %q command %q, want the user's image running Stoke's copied binary", rs.Image, rs.Command)
	}
	if got := strings.Join(rs.Args, " "); !strings.Contains(got, "--handler-env *") {
		t.Errorf("runtime-server args %q: a user's image gives its handlers the container's environment", got)
	}
	if rd.Image != "stoke:1" || strings.Join(rd.Command, " ") != "stoke" {
		t.Errorf("runtimed image %q command %q, want Stoke's own", rd.Image, rd.Command)
	}
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the one that copies stoke", len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	if ic.Name != ContainerInstall || ic.Image != "stoke:1" || strings.Join(ic.Command, " ") != "stoke install-binary "+BinDir+"/stoke" || mounts(ic)[volumeBin] != BinDir {
		t.Errorf("init container %+v", ic)
	}
	if m := mounts(rs); m[volumeBin] != BinDir || m["models"] != "/models" || m[volumeToken] != "" {
		t.Errorf("runtime-server mounts %v", m)
	}
	for _, vm := range rs.VolumeMounts {
		if vm.Name == volumeBin && !vm.ReadOnly {
			t.Error("the runtime-server container, which runs users' code, may write Stoke's binary")
		}
	}
	if m := mounts(rd); m["models"] != "" || m[volumeToken] != tokenDir {
		t.Errorf("runtimed mounts %v", m)
	}
	var env []string
	for _, e := range rs.Env {
		env = append(env, e.Name)
	}
	if got := strings.Join(env, ","); got != "POD_NAME,POD_NAMESPACE,POD_UID,POD_IP,PYTHONPATH,HF_TOKEN" {
		t.Errorf("runtime-server env %s", got)
	}
	if len(rd.Env) != 4 {
		t.Errorf("runtimed env %+v, want Stoke's four alone", rd.Env)
	}
	if q := rs.Resources.Requests[corev1.ResourceCPU]; q.Cmp(cpu) != 0 || len(rd.Resources.Requests) != 0 {
		t.Errorf("resources: runtime-server %v, runtimed %v", rs.Resources, rd.Resources)
	}
	if spec.NodeSelector["pool"] != "ml" || len(spec.Tolerations) != 1 || spec.Affinity == nil || spec.PriorityClassName != "high" ||
		len(spec.ImagePullSecrets) != 1 || spec.ServiceAccountName != ServiceAccount || *spec.AutomountServiceAccountToken {
		t.Errorf("pod spec %+v", spec)
	}
	var vols []string
	for _, v := range spec.Volumes {
		vols = append(vols, v.Name)
	}
	if got := strings.Join(vols, ","); got != "run,workspace,git-cache,runtimed-state,tls,kube-api-access,models,stoke-bin" {
		t.Errorf("volumes %s", got)
	}
	// The git cache is runtimed's alone: the Runs, in runtime-server,
	// never see it.
	mounted := func(c corev1.Container) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volumeGitCache })
	}
	if !mounted(rd) || mounted(rs) || !strings.Contains(strings.Join(rd.Args, " "), "--git-cache "+GitCacheDir) {
		t.Errorf("git cache: runtimed mounts it %v (args %v), runtime-server %v", mounted(rd), rd.Args, mounted(rs))
	}

	// Env alone, on Stoke's image: no init container, and the handlers
	// get those names.
	rt.Spec.Template = &v1alpha1.RuntimeTemplate{Env: []corev1.EnvVar{{Name: "PYTHONPATH", Value: "/opt/lib"}}}
	spec = Deployment(rt, Options{Image: "stoke:1"}).Spec.Template.Spec
	rs = container(t, spec, ContainerRuntimeServer)
	if len(spec.InitContainers) != 0 || rs.Image != "stoke:1" || !strings.HasSuffix(strings.Join(rs.Args, " "), "--handler-env PYTHONPATH") {
		t.Errorf("env alone: init %d, image %q, args %q", len(spec.InitContainers), rs.Image, rs.Args)
	}
}

// A template's ServiceAccount: the runtime-server container, and it
// alone, mounts its Runtime's token from the namespace's token Secret at
// the ServiceAccount token's path; the Pod's ServiceAccount stays
// stoke-runtimed, whose token only runtimed mounts. Without a
// serviceAccountName, or with the token turned off, no token volume.
func TestDeploymentMountsTheTemplatesToken(t *testing.T) {
	rt := runtimeObj("python-sa", "python", 1, 1)
	rt.Spec.Template = &v1alpha1.RuntimeTemplate{ServiceAccountName: "reader"}
	spec := Deployment(rt, Options{}).Spec.Template.Spec
	if spec.ServiceAccountName != ServiceAccount || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("the Pod's ServiceAccount %q (automount %v), want %s without automount", spec.ServiceAccountName, spec.AutomountServiceAccountToken, ServiceAccount)
	}
	rs, rd := mounts(container(t, spec, ContainerRuntimeServer)), mounts(container(t, spec, ContainerRuntimed))
	if rs[volumeServerToken] != tokenDir || rs[volumeToken] != "" {
		t.Errorf("runtime-server mounts %v, want %s at %s and not %s", rs, volumeServerToken, tokenDir, volumeToken)
	}
	if rd[volumeServerToken] != "" || rd[volumeToken] != tokenDir {
		t.Errorf("runtimed mounts %v, want %s at %s and not %s", rd, volumeToken, tokenDir, volumeServerToken)
	}
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeServerToken })
	if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != TokenSecret ||
		spec.Volumes[i].Secret.Items[0] != (corev1.KeyToPath{Key: "python-sa.token", Path: "token"}) {
		t.Fatalf("the token volume: %+v", spec.Volumes)
	}
	for _, tpl := range []*v1alpha1.RuntimeTemplate{nil, {}, {ServiceAccountName: "reader", AutomountServiceAccountToken: new(false)}} {
		rt.Spec.Template = tpl
		spec := Deployment(rt, Options{}).Spec.Template.Spec
		if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeServerToken }) {
			t.Errorf("template %+v: a token volume", tpl)
		}
	}
}

// A Runtime's spec.git.credentialsSecret is a volume of its one key,
// mounted in runtimed alone, which reads it through --git-credentials;
// the runtime-server container, where users' code runs, has no such
// mount. Without it there is no such volume.
func TestDeploymentMountsGitCredentialsInRuntimedOnly(t *testing.T) {
	rt := runtimeObj("bash-git", "bash", 1, 1)
	rt.Spec.Git = &v1alpha1.RuntimeGit{CredentialsSecret: "git-creds"}
	spec := Deployment(rt, Options{}).Spec.Template.Spec
	rs, rd := container(t, spec, ContainerRuntimeServer), container(t, spec, ContainerRuntimed)
	if m := mounts(rd); m[volumeGitCreds] != GitCredentialsDir {
		t.Errorf("runtimed mounts %v, want %s at %s", m, volumeGitCreds, GitCredentialsDir)
	}
	if m := mounts(rs); m[volumeGitCreds] != "" {
		t.Errorf("runtime-server mounts the git credentials: %v", m)
	}
	args := strings.Join(rd.Args, " ")
	if !strings.Contains(args, "--git-credentials "+GitCredentialsDir+"/git-credentials --git-credentials-secret git-creds") {
		t.Errorf("runtimed's arguments %q", args)
	}
	if strings.Contains(strings.Join(rs.Args, " "), "git-cred") {
		t.Errorf("runtime-server's arguments %q name the git credentials", rs.Args)
	}
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeGitCreds })
	if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != "git-creds" ||
		len(spec.Volumes[i].Secret.Items) != 1 || spec.Volumes[i].Secret.Items[0] != (corev1.KeyToPath{Key: "git-credentials", Path: "git-credentials"}) ||
		*spec.Volumes[i].Secret.DefaultMode != 0o400 {
		t.Fatalf("the git credentials volume: %+v", spec.Volumes)
	}
	rt.Spec.Git = nil
	spec = Deployment(rt, Options{}).Spec.Template.Spec
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeGitCreds }) ||
		slices.Contains(container(t, spec, ContainerRuntimed).Args, "--git-credentials") {
		t.Error("a Runtime without spec.git has git credentials")
	}
}
