package runtimeset

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/pki"
	"stoke.dev/stoke/internal/podsource"
)

// Labels, names and paths of a runtime Pod (KUBE.md's conventions).
const (
	// LabelRuntime names a runtime Pod's Runtime (same namespace).
	LabelRuntime = "stoke.dev/runtime"
	// LabelName and NameRuntimePod mark every runtime Pod and Deployment.
	LabelName      = "app.kubernetes.io/name"
	NameRuntimePod = "stoke-runtime"
	// AnnotationTemplateHash is the hash of the Deployment spec the
	// reconciler last wrote: a Runtime whose hash matches needs no write.
	AnnotationTemplateHash = "stoke.dev/template-hash"

	ContainerRuntimeServer = "runtime-server"
	ContainerRuntimed      = "runtimed"
	// ContainerInstall is the init container that copies Stoke's binary
	// into BinDir when the runtime-server container runs a user's image.
	ContainerInstall = "install-stoke"
	// BinDir is the emptyDir that holds that copy, mounted read-only in
	// the runtime-server container, whose command it is.
	BinDir = "/var/run/stoke-bin"

	// RunDir is the emptyDir both containers share for the Runtime
	// Server's socket and runtimed's probe socket.
	RunDir        = "/var/run/stoke"
	RuntimeServer = "unix://" + RunDir + "/rs.sock"
	// ProbeSocket is in a directory runtimed makes 0700 itself: a
	// non-root container cannot chmod the emptyDir the kubelet made.
	ProbeSocket = RunDir + "/runtimed/probe.sock"
	// RuntimedDebugSocket and RuntimeServerDebugSocket serve Go's
	// profiles (internal/debugsock), each in a 0700 directory of its
	// container's own.
	RuntimedDebugSocket      = RunDir + "/runtimed/debug.sock"
	RuntimeServerDebugSocket = RunDir + "/runtime-server/debug.sock"
	WorkspaceDir             = "/workspace"
	// RunLogDir holds the Runs' output logs, in the workspace volume (on
	// disk, shared by both containers): the Runtime Server writes them,
	// runtimed serves them to the gateway. They live as long as the Pod,
	// or until their Run is deleted.
	RunLogDir = WorkspaceDir + "/.stoke-run-logs"
	// PythonDepsDir is a python Runtime's requirements cache
	// (internal/pydeps), in the workspace volume: per Pod, shared by the
	// Runs on it, as long as the Pod lives.
	PythonDepsDir = WorkspaceDir + "/.stoke-pydeps"
	// GitCacheDir is the pod's git cache (spec.source.git), an emptyDir
	// mounted in the runtimed container only, so that no Run (they run in
	// the runtime-server container) can change what the next checks out.
	GitCacheDir = "/var/cache/stoke-git"
	// RuntimedStateDir is runtimed's own state (its --state-dir: the
	// marks of the tasks it started before writing them Running), an
	// emptyDir in memory mounted in the runtimed container only, which
	// outlives runtimed's restarts and no Run can change.
	RuntimedStateDir = "/var/lib/stoke-runtimed"
	TLSDir           = "/var/run/stoke-tls"
	HopPort          = 7443
	ServiceAccount   = "stoke-runtimed"
	tokenDir         = "/var/run/secrets/kubernetes.io/serviceaccount"
	tokenExpiry      = 3607 // what the ServiceAccount admission plugin asks for
	volumeRun        = "run"
	volumeWorkspace  = "workspace"
	volumeTLS        = "tls"
	volumeToken      = "kube-api-access"
	volumeBin        = "stoke-bin"
	volumeGitCache   = "git-cache"
	volumeRuntimed   = "runtimed-state"
	defaultImage     = "stoke"
)

// The runtimed container's copy of the Runtime's spec.git.credentialsSecret.
const (
	// GitCredentialsDir holds the Secret's git-credentials key, mounted
	// in the runtimed container only: users' code, in the runtime-server
	// container, never sees it.
	GitCredentialsDir = "/var/run/stoke-git-credentials"
	volumeGitCreds    = "git-credentials"
)

// selector is what a Runtime's Deployment selects; it never changes.
func selector(rt *v1alpha1.Runtime) map[string]string {
	return map[string]string{LabelName: NameRuntimePod, LabelRuntime: rt.Name}
}

// Deployment is the Deployment a Runtime becomes (without its owner
// reference): spec.replicas runtime Pods, each with the runtime-server and
// runtimed containers.
func Deployment(rt *v1alpha1.Runtime, opts Options) *appsv1.Deployment {
	opts = opts.withDefaults()
	labels := selector(rt)
	downward := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
	}
	env := []corev1.EnvVar{
		downward("POD_NAME", "metadata.name"),
		downward("POD_NAMESPACE", "metadata.namespace"),
		downward("POD_UID", "metadata.uid"),
		downward("POD_IP", "status.podIP"),
	}
	restricted := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	runMount := corev1.VolumeMount{Name: volumeRun, MountPath: RunDir}
	wsMount := corev1.VolumeMount{Name: volumeWorkspace, MountPath: WorkspaceDir}
	tpl := rt.Spec.Template
	if tpl == nil {
		tpl = &v1alpha1.RuntimeTemplate{}
	}
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rt.Namespace,
			Name:      rt.Name,
			Labels:    labels,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(rt.Spec.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: ServiceAccount,
					// Only runtimed gets the ServiceAccount's token (the
					// volume below): the runtime-server container runs
					// users' code.
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To(int64(opts.TerminationGracePeriod.Seconds())),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To(opts.RunAsUser),
						RunAsGroup:     ptr.To(opts.RunAsUser),
						FSGroup:        ptr.To(opts.RunAsUser),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{
						{
							Name:            ContainerRuntimeServer,
							Image:           opts.Image,
							ImagePullPolicy: opts.ImagePullPolicy,
							Command:         []string{"stoke"},
							Args:            runtimeServerArgs(rt),
							Env:             append(slices.Clip(env), tpl.Env...),
							VolumeMounts:    append([]corev1.VolumeMount{runMount, wsMount}, tpl.VolumeMounts...),
							SecurityContext: restricted,
						},
						{
							Name:            ContainerRuntimed,
							Image:           opts.Image,
							ImagePullPolicy: opts.ImagePullPolicy,
							Command:         []string{"stoke"},
							Args:            runtimedArgs(rt, opts.GatewayURL),
							Env:             env,
							Ports:           []corev1.ContainerPort{{Name: "hop", ContainerPort: HopPort, Protocol: corev1.ProtocolTCP}},
							VolumeMounts: []corev1.VolumeMount{runMount, wsMount,
								{Name: volumeTLS, MountPath: TLSDir, ReadOnly: true},
								{Name: volumeToken, MountPath: tokenDir, ReadOnly: true},
								{Name: volumeGitCache, MountPath: GitCacheDir},
								{Name: volumeRuntimed, MountPath: RuntimedStateDir},
							},
							ReadinessProbe: &corev1.Probe{
								ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
									Command: []string{"stoke", "runtimed", "probe", "--probe-socket", ProbeSocket},
								}},
								// Ready at the first success; NotReady after
								// three failures, so that one probe slowed by a
								// busy node fences nothing (a dead runtimed's
								// Lease expires within 10 s anyway).
								PeriodSeconds:    2,
								TimeoutSeconds:   5,
								FailureThreshold: 3,
								SuccessThreshold: 1,
							},
							SecurityContext: restricted,
						},
					},
					Volumes: []corev1.Volume{
						{Name: volumeRun, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
						{Name: volumeWorkspace, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: volumeGitCache, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: volumeRuntimed, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
						{Name: volumeTLS, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName: pki.RuntimedSecret, DefaultMode: ptr.To(int32(0o400)),
						}}},
						tokenVolume(),
					},
				},
			},
		},
	}
	applyGitCredentials(&d.Spec.Template.Spec, rt)
	applyTemplate(&d.Spec.Template.Spec, rt, tpl, opts, restricted)
	d.Annotations = map[string]string{AnnotationTemplateHash: specHash(&d.Spec)}
	return d
}

// applyGitCredentials mounts the Runtime's spec.git.credentialsSecret in
// the runtimed container alone (0400, the one key), which reads it as
// stoke up reads its --git-credentials file: the Secret reaches git
// through its environment, never users' code, arguments or logs.
func applyGitCredentials(spec *corev1.PodSpec, rt *v1alpha1.Runtime) {
	g := rt.Spec.Git
	if g == nil || g.CredentialsSecret == "" {
		return
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: volumeGitCreds, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName:  g.CredentialsSecret,
		Items:       []corev1.KeyToPath{{Key: v1alpha1.GitCredentialsKey, Path: v1alpha1.GitCredentialsKey}},
		DefaultMode: ptr.To(int32(0o400)),
	}}})
	rd := &spec.Containers[1]
	rd.VolumeMounts = append(rd.VolumeMounts, corev1.VolumeMount{Name: volumeGitCreds, MountPath: GitCredentialsDir, ReadOnly: true})
	rd.Args = append(rd.Args,
		"--git-credentials", GitCredentialsDir+"/"+v1alpha1.GitCredentialsKey,
		"--git-credentials-secret", g.CredentialsSecret)
}

// applyTemplate puts a Runtime's template on the Pod spec the reconciler
// built: the Pod's scheduling and pull secrets, its volumes after Stoke's
// own, and, for a user's image, that image in the runtime-server
// container with Stoke's binary copied from Stoke's image by an init
// container into an emptyDir (an init container rather than an image
// volume: it works on every Kubernetes version and container runtime).
// The container's env, mounts and resources are the template's too.
func applyTemplate(spec *corev1.PodSpec, rt *v1alpha1.Runtime, tpl *v1alpha1.RuntimeTemplate, opts Options, restricted *corev1.SecurityContext) {
	spec.NodeSelector = tpl.NodeSelector
	spec.Tolerations = tpl.Tolerations
	spec.Affinity = tpl.Affinity
	spec.PriorityClassName = tpl.PriorityClassName
	spec.ImagePullSecrets = tpl.ImagePullSecrets
	spec.Volumes = append(spec.Volumes, tpl.Volumes...)
	rs := &spec.Containers[0]
	if tpl.MountsServiceAccountToken() {
		// The template's ServiceAccount's token (tokens.go), in the
		// runtime-server container alone.
		spec.Volumes = append(spec.Volumes, serverTokenVolume(rt))
		rs.VolumeMounts = append(rs.VolumeMounts, corev1.VolumeMount{Name: volumeServerToken, MountPath: tokenDir, ReadOnly: true})
	}
	if tpl.Resources != nil {
		rs.Resources = *tpl.Resources
	}
	if tpl.Image == "" {
		return
	}
	rs.Image = tpl.Image
	rs.ImagePullPolicy = cmp.Or(tpl.ImagePullPolicy, corev1.PullIfNotPresent)
	rs.Command = []string{BinDir + "/stoke"}
	rs.VolumeMounts = append(rs.VolumeMounts, corev1.VolumeMount{Name: volumeBin, MountPath: BinDir, ReadOnly: true})
	spec.InitContainers = []corev1.Container{{
		Name:            ContainerInstall,
		Image:           opts.Image,
		ImagePullPolicy: opts.ImagePullPolicy,
		Command:         []string{"stoke", "install-binary", BinDir + "/stoke"},
		VolumeMounts:    []corev1.VolumeMount{{Name: volumeBin, MountPath: BinDir}},
		SecurityContext: restricted,
	}}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: volumeBin, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
}

// tokenVolume is what the ServiceAccount admission plugin would mount in
// every container, mounted in runtimed alone.
func tokenVolume() corev1.Volume {
	return corev1.Volume{Name: volumeToken, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To(int32(0o444)),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(tokenExpiry))}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
			}}}},
		},
	}}}
}

// runtimeServerArgs are the runtime-server container's arguments: the
// Runtime's server, its lambda configuration, invoke timeout and the
// environment its handlers get.
func runtimeServerArgs(rt *v1alpha1.Runtime) []string {
	args := []string{"runtime-server",
		"--runtime", rt.Spec.Server,
		"--listen", RuntimeServer,
		"--workspace-root", WorkspaceDir,
		"--debug-socket", RuntimeServerDebugSocket,
		"--run-log-dir", RunLogDir,
	}
	if rt.Spec.Server == "python" {
		// A Run's requirements.txt is installed once per digest into
		// the Pod's own cache, which every Run on the Pod shares.
		args = append(args, "--python-deps", PythonDepsDir)
	}
	if t := rt.Spec.DefaultInvokeTimeout; t != nil && t.Duration > 0 {
		args = append(args, "--default-invoke-timeout", t.Duration.String())
	}
	args = append(args, podsource.HandlerEnvArgs(rt.Spec.Template)...)
	return append(args, podsource.LambdaArgs(rt.Spec.Lambda)...)
}

// runtimedArgs are the runtimed container's arguments. $(POD_IP) is
// expanded by the kubelet from the container's env.
func runtimedArgs(rt *v1alpha1.Runtime, gatewayURL string) []string {
	args := []string{"runtimed",
		"--runtime", rt.Name,
		"--listen", "$(POD_IP):" + strconv.Itoa(HopPort),
		"--runtime-server", RuntimeServer,
		"--workspace-root", WorkspaceDir,
		"--tls-dir", TLSDir,
		"--probe-socket", ProbeSocket,
		"--debug-socket", RuntimedDebugSocket,
		"--run-log-dir", RunLogDir,
		"--git-cache", GitCacheDir,
		"--state-dir", RuntimedStateDir,
	}
	if gatewayURL != "" {
		args = append(args, "--endpoint-base", gatewayURL)
	}
	if t := rt.Spec.DefaultTaskTimeout; t != nil && t.Duration > 0 {
		args = append(args, "--default-task-timeout", t.Duration.String())
	}
	if t := rt.Spec.DefaultFunctionTimeout; t != nil && t.Duration > 0 {
		args = append(args, "--default-function-timeout", t.Duration.String())
	}
	return args
}

// specHash identifies a Deployment spec as the reconciler wrote it; the
// API server's defaults never enter it, so that an unchanged Runtime is
// recognised without comparing defaulted fields.
func specHash(spec *appsv1.DeploymentSpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		panic(err) // a DeploymentSpec always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}
