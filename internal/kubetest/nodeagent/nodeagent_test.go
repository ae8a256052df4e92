package nodeagent_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/kubetest/nodeagent"
	"stoke.dev/stoke/internal/testbin"
)

var stoke string

func TestMain(m *testing.M) {
	path, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stoke = path
	defer cleanup()
	kubetest.Main(m, kubetest.Options{ControllerManager: true, Scheduler: true})
}

// waitBound bounds every wait for the cluster in these tests; the machine
// is shared and loaded.
const waitBound = 2 * time.Minute

// waitPod watches Pod ns/name until cond holds and returns it.
func waitPod(t *testing.T, cs kubernetes.Interface, ns, name string, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	var last *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted {
			return false, nil
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: %s: %v; last seen: %+v", ns, name, what, err, last)
	}
	return last
}

// waitPodGone waits until Pod ns/name with uid is gone from the API.
func waitPodGone(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		return len(store.List()) == 0, nil
	}, func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil })
	if err != nil {
		t.Fatalf("pod %s/%s was not removed: %v", ns, name, err)
	}
}

func condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func ready(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue }

// withMarker returns the live host processes whose environment holds marker.
func withMarker(marker string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err != nil || bytes.Contains(st, []byte(") Z ")) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

func startAgent(t *testing.T, c *kubetest.Cluster, node string) *nodeagent.Agent {
	return nodeagent.StartTest(t, nodeagent.Config{
		RESTConfig: c.Config, NodeName: node,
		Image: nodeagent.ImageMap(stoke, map[string]string{
			"busybox": "/bin/sh",
			"kubectl": filepath.Join(c.BinDir, "kubectl"),
		}),
	})
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// TestPod follows one Pod through the agent: the real scheduler binds it
// to the agent's node, its container runs with the downward API, its
// volumes and the service-account token, an exec readiness probe makes
// it Ready, and deleting it kills everything it started (a setsid escapee
// too) before the Pod object goes.
func TestPod(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := startAgent(t, c, "stoke-node-pod")

	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"password": "hunter2"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("m%d", time.Now().UnixNano())
	// $(POD_IP) is the kubelet's expansion, before the shell sees it.
	script := `echo "listen=$(POD_IP)" > /work/listen
setsid sleep 3600 &
touch /work/ready
exec sleep 3600`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox", Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{
					fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace"),
					fieldEnv("POD_UID", "metadata.uid"), fieldEnv("POD_IP", "status.podIP"),
					fieldEnv("NODE", "spec.nodeName"), fieldEnv("SA", "spec.serviceAccountName"),
					{Name: "MARKER", Value: marker},
					{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
					{Name: "LISTEN", Value: "$(POD_IP):7443"},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}, {Name: "creds", MountPath: "/etc/stoke-creds"}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/work/ready"}}},
					PeriodSeconds: 1,
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
			},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "p", "Ready", ready)

	if p.Spec.NodeName != a.NodeName() {
		t.Errorf("bound to %q, want the agent's node", p.Spec.NodeName)
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil || !ip.IsLoopback() || ip == netip.MustParseAddr("127.0.0.1") {
		t.Errorf("podIP = %q, want a loopback address of its own", p.Status.PodIP)
	}
	if p.Status.Phase != corev1.PodRunning || p.Status.HostIP != "127.0.0.1" || len(p.Status.PodIPs) != 1 || p.Status.StartTime == nil {
		t.Errorf("status = %+v", p.Status)
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if condition(p, ct) != corev1.ConditionTrue {
			t.Errorf("condition %s = %q", ct, condition(p, ct))
		}
	}
	if len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("containerStatuses = %+v", p.Status.ContainerStatuses)
	}
	if st := p.Status.ContainerStatuses[0]; !st.Ready || st.Started == nil || !*st.Started || st.State.Running == nil || st.RestartCount != 0 || st.ContainerID == "" {
		t.Errorf("container status = %+v", st)
	}

	exec := func(argv ...string) string {
		t.Helper()
		res, err := a.Exec(ctx, ns, "p", "main", argv, 30*time.Second)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %v %+v", argv, err, res)
		}
		return strings.TrimSpace(res.Output)
	}
	want := map[string]string{
		"POD_NAME": "p", "POD_NAMESPACE": ns, "POD_UID": string(created.UID), "POD_IP": p.Status.PodIP,
		"NODE": a.NodeName(), "SA": "default", "PASSWORD": "hunter2", "LISTEN": p.Status.PodIP + ":7443",
		"KUBERNETES_SERVICE_HOST": "127.0.0.1",
	}
	for k, v := range want {
		if got := exec("printenv", k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := exec("cat", "/work/listen"); got != "listen="+p.Status.PodIP {
		t.Errorf("the command's $(POD_IP) = %q", got)
	}
	if got := exec("cat", "/etc/stoke-creds/password"); got != "hunter2" {
		t.Errorf("secret volume file = %q", got)
	}
	if got := exec("hostname"); got != "p" {
		t.Errorf("hostname = %q", got)
	}

	// The service-account token: a TokenRequest bound to the Pod, usable
	// by client-go's in-cluster config (kubectl in the container).
	token := exec("cat", "/var/run/secrets/kubernetes.io/serviceaccount/token")
	if got := exec("cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"); got != ns {
		t.Errorf("serviceaccount/namespace = %q", got)
	}
	sa := rest.AnonymousClientConfig(c.Config)
	sa.BearerToken = token
	sacs, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	review, err := sacs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if u.Username != "system:serviceaccount:"+ns+":default" || !contains(u.Extra["authentication.kubernetes.io/pod-uid"], string(created.UID)) {
		t.Errorf("the token's user = %+v, want the default service account bound to the Pod", u)
	}
	whoami := exec(filepath.Join(c.BinDir, "kubectl"), "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	if whoami != "system:serviceaccount:"+ns+":default" {
		t.Errorf("kubectl auth whoami in the container (in-cluster config) = %q", whoami)
	}

	// The command and its setsid escapee, as the host sees them.
	deadline := time.Now().Add(waitBound)
	for len(withMarker(marker)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the container's processes: %v, want the sleep and the escapee", withMarker(marker))
		}
		time.Sleep(20 * time.Millisecond) // polling /proc: no event
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(5))}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cs, ns, "p")
	if left := withMarker(marker); len(left) > 0 {
		t.Errorf("processes left after the Pod was removed: %v", left)
	}
}

// dumpPods logs the namespace's Pods' status and container logs.
func dumpPods(t *testing.T, cs kubernetes.Interface, a *nodeagent.Agent, ns string) {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s: node %q phase %s conditions %+v containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		for _, c := range p.Spec.Containers {
			if path, err := a.LogPath(ns, p.Name, c.Name); err == nil {
				b, _ := os.ReadFile(path)
				t.Logf("pod %s container %s log:\n%s", p.Name, c.Name, b)
			}
		}
	}
}

// untilStop is a shell loop that ends once dir/stop exists, removing it,
// so that a test ends a container's command from an exec whose answer
// comes back before the container goes.
func untilStop(dir string) string {
	return "while [ ! -e " + dir + "/stop ]; do sleep 0.1; done; rm " + dir + "/stop"
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestDeployment: a Deployment's two replicas run on the node with
// distinct Pod IPs, each serving on its own address (an httpGet readiness
// probe against the Pod IP), and a container that exits is restarted.
func TestDeployment(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := startAgent(t, c, "stoke-node-deploy")
	labels := map[string]string{"app": "web"}
	// python3 serves HTTP on the Pod IP.
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "web", Image: "busybox",
						Command:      []string{"sh", "-c", "python3 -m http.server --bind $(POD_IP) 8080 --directory /srv & " + untilStop("/srv") + "; kill $!; exit 1"},
						Env:          []corev1.EnvVar{fieldEnv("POD_IP", "status.podIP")},
						Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						VolumeMounts: []corev1.VolumeMount{{Name: "srv", MountPath: "/srv"}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}},
							PeriodSeconds: 1,
						},
					}},
					Volumes:                       []corev1.Volume{{Name: "srv", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					TerminationGracePeriodSeconds: ptr.To(int64(2)),
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, func(*metav1.ListOptions) {})
	readyPods := map[string]bool{}
	_, err = watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if p, ok := ev.Object.(*corev1.Pod); ok {
			readyPods[p.Name] = ev.Type != watch.Deleted && ready(p) && p.DeletionTimestamp == nil
		}
		n := 0
		for _, r := range readyPods {
			if r {
				n++
			}
		}
		return n == 2, nil
	})
	if err != nil {
		dumpPods(t, cs, a, ns)
		t.Fatalf("two Ready replicas: %v", err)
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]bool{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != a.NodeName() || p.Status.Phase != corev1.PodRunning || !ready(&p) {
			t.Errorf("pod %s: node %q phase %s ready %v", p.Name, p.Spec.NodeName, p.Status.Phase, ready(&p))
		}
		ips[p.Status.PodIP] = true
	}
	if len(pods.Items) != 2 || len(ips) != 2 {
		t.Errorf("pods %d with IPs %v, want 2 with distinct IPs", len(pods.Items), ips)
	}

	// A container that dies is restarted (restartPolicy Always): the
	// count goes up and the Pod is Ready again.
	p := pods.Items[0]
	if res, err := a.Exec(ctx, ns, p.Name, "web", []string{"touch", "/srv/stop"}, 10*time.Second); err != nil || res.ExitCode != 0 {
		t.Fatal(err, res)
	}
	waitPod(t, cs, ns, p.Name, "restarted and Ready", func(p *corev1.Pod) bool {
		return ready(p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 1 &&
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated != nil
	})
}

// TestLifecycle: the node Lease is renewed; Pods that end under
// restartPolicy Never reach Succeeded or Failed with their exit codes; a
// container that ignores SIGTERM gets it, then SIGKILL after the grace
// period, and its Pod is removed.
func TestLifecycle(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := "stoke-node-lifecycle"
	a := nodeagent.StartTest(t, nodeagent.Config{
		RESTConfig: c.Config, NodeName: node, LeaseDuration: 4 * time.Second,
		Image: nodeagent.ImageMap(stoke, map[string]string{"busybox": "/bin/sh"}),
	})

	lease, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") != node || len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].Kind != "Node" {
		t.Errorf("node lease = %+v", lease)
	}
	wctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoordinationV1().RESTClient(), "leases", corev1.NamespaceNodeLease,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
		})
	if _, err := watchtools.UntilWithSync(wctx, lw, &coordinationv1.Lease{}, nil, func(ev watch.Event) (bool, error) {
		l, ok := ev.Object.(*coordinationv1.Lease)
		return ok && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(lease.Spec.RenewTime.Time), nil
	}); err != nil {
		t.Errorf("the node lease was not renewed: %v", err)
	}

	out := filepath.Join(t.TempDir(), "out") // made by the agent (DirectoryOrCreate)
	marker := fmt.Sprintf("m%d", time.Now().UnixNano())
	for name, script := range map[string]string{
		"ok":       "echo bye",
		"failed":   "exit 3",
		"stubborn": `trap 'echo term >> /out/signals' TERM; touch /out/up; while :; do sleep 0.1; done`,
	} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: "busybox", Command: []string{"sh", "-c", script},
					Env:          []corev1.EnvVar{{Name: "MARKER", Value: marker}},
					VolumeMounts: []corev1.VolumeMount{{Name: "out", MountPath: "/out"}},
				}},
				Volumes: []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: out, Type: ptr.To(corev1.HostPathDirectoryOrCreate),
				}}}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	terminated := func(p *corev1.Pod) *corev1.ContainerStateTerminated {
		if len(p.Status.ContainerStatuses) != 1 {
			return nil
		}
		return p.Status.ContainerStatuses[0].State.Terminated
	}
	p := waitPod(t, cs, ns, "ok", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if st := terminated(p); st == nil || st.ExitCode != 0 || st.Reason != "Completed" || ready(p) {
		t.Errorf("ok: %+v", p.Status)
	}
	p = waitPod(t, cs, ns, "failed", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if st := terminated(p); st == nil || st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("failed: %+v", p.Status)
	}
	if path, err := a.LogPath(ns, "ok", "main"); err != nil {
		t.Error(err)
	} else if b, err := os.ReadFile(path); err != nil || string(b) != "bye\n" {
		t.Errorf("ok's log = %q, %v", b, err)
	}

	waitPod(t, cs, ns, "stubborn", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	deadline := time.Now().Add(waitBound)
	for _, err := os.Stat(filepath.Join(out, "up")); err != nil; _, err = os.Stat(filepath.Join(out, "up")) {
		if time.Now().After(deadline) {
			t.Fatal("the stubborn container did not start its loop")
		}
		time.Sleep(20 * time.Millisecond) // polling a file: no event
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "stubborn", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cs, ns, "stubborn")
	if b, err := os.ReadFile(filepath.Join(out, "signals")); err != nil || string(b) != "term\n" {
		t.Errorf("signals the stubborn container saw: %q, %v; want SIGTERM first", b, err)
	}
	if left := withMarker(marker); len(left) > 0 {
		t.Errorf("processes left after the Pods were removed or ended: %v", left)
	}
}

// TestStokePod runs the stoke image as a runtime Pod's containers do:
// stoke by name from the image's PATH (in the command and in an exec
// probe), a Runtime Server on a Unix socket in
// an emptyDir at /var/run/stoke, which the Pod's other container sees
// (its exec readiness probe tests for the socket).
func TestStokePod(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startAgent(t, c, "stoke-node-stoke")
	mounts := []corev1.VolumeMount{{Name: "run", MountPath: "/var/run/stoke"}, {Name: "workspace", MountPath: "/workspace"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rt"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				// As internal/runtimeset writes it: stoke by name, from the image's PATH.
				Name: "runtime-server", Image: "stoke", Command: []string{"stoke"},
				Args: []string{"runtime-server", "--listen", "unix:///var/run/stoke/rs.sock", "--workspace-root", "/workspace"},
				// An emptyDir over /tmp hides the host's /tmp, where the
				// test's stoke is: the image's program is still there.
				VolumeMounts: append([]corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}}, mounts...),
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"stoke", "version"}}},
					PeriodSeconds: 1,
				},
			}, {
				Name: "probe", Image: "busybox", Command: []string{"sh", "-c", "exec sleep 3600"},
				VolumeMounts: mounts,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-S", "/var/run/stoke/rs.sock"}}},
					PeriodSeconds: 1,
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			TerminationGracePeriodSeconds: ptr.To(int64(5)),
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "rt", "Ready", ready)
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == "runtime-server" && (st.ImageID != "stoke-nodeagent://"+stoke || st.State.Running == nil) {
			t.Errorf("runtime-server status = %+v", st)
		}
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "rt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cs, ns, "rt")
}

// TestAPIServerAway: what happens on the node while the API server is
// stopped (a container restarts) reaches the Pod's status once it is
// back, and the Pod's deletion still completes.
func TestAPIServerAway(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{ControllerManager: true, Scheduler: true})
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := startAgent(t, c, "stoke-node-away")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox", Command: []string{"sh", "-c", untilStop("/work")},
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}},
			}},
			Volumes:                       []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			TerminationGracePeriodSeconds: ptr.To(int64(5)),
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cs, ns, "p", "Ready", ready)

	c.StopAPIServer(t)
	if res, err := a.Exec(ctx, ns, "p", "main", []string{"touch", "/work/stop"}, 10*time.Second); err != nil || res.ExitCode != 0 {
		t.Fatalf("stop the container's command: %v %+v", err, res)
	}
	c.StartAPIServer(t)
	waitPod(t, cs, ns, "p", "restarted and Ready", func(p *corev1.Pod) bool {
		return ready(p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cs, ns, "p")
}

// TestInitContainersAndImageFiles runs a Pod with two init containers,
// the first failing once: each runs to success, in order, before the Pod's
// container starts, which runs an image of files (Config.Images) and
// finds them at ImageRoot through its ENV.
func TestInitContainersAndImageFiles(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "greeting.txt"), []byte("from the image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := nodeagent.StartTest(t, nodeagent.Config{
		RESTConfig: c.Config, NodeName: "stoke-node-init",
		Image: nodeagent.ImageMap(stoke, map[string]string{"busybox": "/bin/sh"}),
		Images: map[string]nodeagent.Image{"example.com/user:1": {
			Root: root, Env: []string{"GREETING_FILE=" + nodeagent.ImageRoot + "/greeting.txt"},
		}},
		RestartBackoff: 100 * time.Millisecond,
	})
	shared := []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "init"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{
				{Name: "one", Image: "busybox", VolumeMounts: shared, Command: []string{"sh", "-c",
					`if [ ! -f /shared/tried ]; then touch /shared/tried; exit 3; fi; echo one >> /shared/order`}},
				{Name: "two", Image: "busybox", VolumeMounts: shared, Command: []string{"sh", "-c", `echo two >> /shared/order`}},
			},
			Containers: []corev1.Container{{
				Name: "main", Image: "example.com/user:1", VolumeMounts: shared,
				Command: []string{"/bin/sh", "-c", `cp /shared/order /shared/seen; cat "$GREETING_FILE" > /shared/greeting; exec sleep 3600`},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/shared/greeting"}}},
					PeriodSeconds: 1,
				},
			}},
			Volumes: []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "init", "Ready", ready)
	if condition(p, corev1.PodInitialized) != corev1.ConditionTrue || len(p.Status.InitContainerStatuses) != 2 {
		t.Fatalf("initialized %q, init statuses %+v", condition(p, corev1.PodInitialized), p.Status.InitContainerStatuses)
	}
	for i, st := range p.Status.InitContainerStatuses {
		if st.State.Terminated == nil || st.State.Terminated.ExitCode != 0 {
			t.Errorf("init container %s: %+v", st.Name, st.State)
		}
		if want := int32(1 - i); st.RestartCount != want {
			t.Errorf("init container %s restarted %d times, want %d", st.Name, st.RestartCount, want)
		}
	}
	for file, want := range map[string]string{"seen": "one\ntwo\n", "greeting": "from the image\n"} {
		res, err := a.Exec(ctx, ns, "init", "main", []string{"cat", "/shared/" + file}, 30*time.Second)
		if err != nil || res.ExitCode != 0 || res.Output != want {
			t.Errorf("/shared/%s: %q (%v %d), want %q", file, res.Output, err, res.ExitCode, want)
		}
	}
}
