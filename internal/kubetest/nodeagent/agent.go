// Package nodeagent is the test node agent: a stand-in for the kubelet,
// and nothing else, for tests that run a real kube-apiserver, scheduler
// and controller-manager on a machine where no kubelet can run. It
// registers a Node and keeps its Lease renewed; runs the containers of
// the Pods bound to that Node as local processes, each in mount, PID and
// UTS namespaces of its own (see containerinit), with the Pod's own
// loopback address as its Pod IP, the downward API, emptyDir, secret,
// configMap and projected volumes (the service-account token included)
// at their mountPaths; runs probes; reports Pod status; and on deletion
// stops a Pod's containers (SIGTERM, SIGKILL after the grace period;
// everything a container started dies with it) and removes the Pod.
//
// What it does not model: images (an image name maps to a local binary,
// or to a directory of files with an ENV (Config.Images); the root file
// system is the host's), resources, cgroups and QoS (requests
// count only for the scheduler), networking beyond loopback (no network
// namespace, Services or DNS; every port of the host is reachable),
// sidecar and ephemeral containers (init containers run in order, each to
// success, before the others), lifecycle hooks, volume updates and token
// refresh, kubectl logs/exec/port-forward (Agent.Exec and Agent.LogPath
// instead), Events, eviction, and node status beyond a Ready Node with
// fixed capacity. It must run as root (namespaces and mounts).
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/internal/kubetest/nodeagent/containerinit"
	"stoke.dev/stoke/internal/testbin"
)

type mountSpec = containerinit.Mount

// hostIP is the Node's address, and every Pod's hostIP.
const hostIP = "127.0.0.1"

// Config configures an Agent.
type Config struct {
	// RESTConfig reaches the API server (required). The agent acts with
	// its credentials (the tests' admin, where a kubelet has its node's).
	RESTConfig *rest.Config
	// NodeName names the Node (required), e.g. "stoke-node-1".
	NodeName string
	// Image maps a container's image to the binary that is its
	// entrypoint. Nil: ImageMap(Stoke, nil).
	Image func(image string) (string, error)
	// Stoke is the stoke binary for images whose name starts with "stoke"
	// when Image is nil.
	Stoke string
	// Images are images of files rather than one binary, by name (looked
	// up before Image): a user's image whose command comes from elsewhere,
	// such as Stoke's binary copied into a volume by an init container.
	Images map[string]Image
	// RootDir holds the agent's state: Pod directories, volumes,
	// container logs, the containers' roots (required; t.TempDir()).
	RootDir string
	// InitBinary is the stoke-container-init binary; empty builds it into
	// RootDir with `go build`.
	InitBinary string
	// IPs allocates Pod IPs; nil is LoopbackIPs().
	IPs IPs
	// BaseEnv is every container's environment before the Pod's (an
	// image's ENV); nil is PATH and HOME from the agent's own.
	BaseEnv []string
	// Capacity is the Node's capacity and allocatable; nil is 32 CPUs,
	// 64 GiB and 110 Pods.
	Capacity corev1.ResourceList
	// LeaseDuration is the node Lease's duration (the kubelet's 40 s by
	// default); it is renewed every quarter of it.
	LeaseDuration time.Duration
	// RestartBackoff is the first delay before restarting an exited
	// container (doubling up to MaxRestartBackoff); the kubelet's are 10 s
	// and 5 min, the defaults here 1 s and 30 s.
	RestartBackoff, MaxRestartBackoff time.Duration
	Logger                            *slog.Logger
	Clock                             clock.WithTicker
}

// Image is an image of Config.Images: a directory of the host standing in
// for the image's file system, bound read-only at ImageRoot in each of its
// containers (the container's root is still the host's), and the image's
// ENV, applied after Config.BaseEnv. A Python path in Env under ImageRoot
// is how such an image carries modules that no other image has.
type Image struct {
	Root string
	Env  []string
}

// ImageMap maps images: an image whose last path element starts with
// "stoke" runs stoke; others are looked up in images by their full name.
func ImageMap(stoke string, images map[string]string) func(string) (string, error) {
	return func(image string) (string, error) {
		if p, ok := images[image]; ok {
			return p, nil
		}
		base := image[strings.LastIndexByte(image, '/')+1:]
		if strings.HasPrefix(base, "stoke") && stoke != "" {
			return stoke, nil
		}
		return "", fmt.Errorf("image %q: the node agent maps no binary to it", image)
	}
}

// Agent is a running node agent.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	clock   clock.WithTicker
	client  kubernetes.Interface
	apiHost string
	apiPort string
	node    *corev1.Node
	init    string
	cleanup func()
	// sockets holds the containers' exec sockets: a short path of its
	// own, since a Unix socket's path is limited to 107 bytes.
	sockets string
	nsock   atomic.Int64

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	stopped bool
}

// Start registers the Node and starts serving the Pods bound to it until
// Stop or ctx's end.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if cfg.RESTConfig == nil || cfg.NodeName == "" || cfg.RootDir == "" {
		return nil, errors.New("node agent: RESTConfig, NodeName and RootDir are required")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("node agent: must run as root: each container runs in mount, PID and UTS namespaces of its own")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Image == nil {
		cfg.Image = ImageMap(cfg.Stoke, nil)
	}
	if cfg.BaseEnv == nil {
		cfg.BaseEnv = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	}
	if cfg.Capacity == nil {
		cfg.Capacity = corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("32"),
			corev1.ResourceMemory: resource.MustParse("64Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
		}
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 40 * time.Second
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.MaxRestartBackoff <= 0 {
		cfg.MaxRestartBackoff = 30 * time.Second
	}
	if cfg.IPs == nil {
		ips, err := LoopbackIPs()
		if err != nil {
			return nil, fmt.Errorf("node agent: %w", err)
		}
		cfg.IPs = ips
	}
	u, err := url.Parse(cfg.RESTConfig.Host)
	if err != nil || u.Host == "" {
		u, err = url.Parse("https://" + cfg.RESTConfig.Host)
	}
	if err != nil {
		return nil, fmt.Errorf("node agent: API server address %q: %w", cfg.RESTConfig.Host, err)
	}
	apiHost, apiPort := u.Hostname(), u.Port()
	if apiPort == "" {
		apiPort = "443"
	}
	client, err := kubernetes.NewForConfig(cfg.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.RootDir, "pods"), 0o700); err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), clock: cfg.Clock, client: client,
		apiHost: apiHost, apiPort: apiPort, workers: map[types.UID]*podWorker{}, init: cfg.InitBinary}
	if a.init == "" {
		path, cleanup, err := testbin.Build("stoke.dev/stoke/internal/kubetest/nodeagent/containerinit/cmd/stoke-container-init", "")
		if err != nil {
			return nil, fmt.Errorf("node agent: %w", err)
		}
		a.init, a.cleanup = path, cleanup
	}
	if a.sockets, err = os.MkdirTemp("", "stoke-nodeagent-"); err != nil {
		a.removeInit()
		return nil, fmt.Errorf("node agent: %w", err)
	}
	if err := a.register(ctx); err != nil {
		a.removeInit()
		return nil, err
	}
	lease, err := a.createLease(ctx)
	if err != nil {
		a.removeInit()
		return nil, err
	}
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.heartbeat(ctx, lease) }()
	if err := a.watchPods(ctx); err != nil {
		a.Stop()
		return nil, err
	}
	return a, nil
}

func (a *Agent) removeInit() {
	if a.cleanup != nil {
		a.cleanup()
	}
	if a.sockets != "" {
		_ = os.RemoveAll(a.sockets)
	}
}

// Stop stops the agent: every container it runs is killed at once, and the
// Node is deleted, so that the scheduler binds no more Pods to it (tests
// share a cluster; nothing here marks a silent node NotReady). The Pod
// objects stay, as when a node goes away. Safe to call more than once.
func (a *Agent) Stop() {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	a.stopped = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := a.client.CoreV1().Nodes().Delete(ctx, a.cfg.NodeName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &a.node.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		a.log.Warn("delete node", "err", err)
	}
	a.removeInit()
}

// NodeName is the Node's name.
func (a *Agent) NodeName() string { return a.cfg.NodeName }

// register creates (or takes over) the Node, Ready, as the kubelet's
// registration and first status update do.
func (a *Agent) register(ctx context.Context) error {
	now := metav1.NewTime(a.clock.Now())
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Labels: map[string]string{
			corev1.LabelHostname: a.cfg.NodeName, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
		}},
	}
	nodes := a.client.CoreV1().Nodes()
	got, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = nodes.Get(ctx, node.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("node agent: register node %s: %w", node.Name, err)
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	got.Status = corev1.NodeStatus{
		Capacity:    a.cfg.Capacity,
		Allocatable: a.cfg.Capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "stoke node agent"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "stoke node agent"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "stoke node agent"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "stoke node agent is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: hostIP}, {Type: corev1.NodeHostName, Address: a.cfg.NodeName}},
		NodeInfo: corev1.NodeSystemInfo{
			OperatingSystem: "linux", Architecture: runtime.GOARCH, KubeletVersion: "v1.37.2-stoke-nodeagent",
			ContainerRuntimeVersion: "stoke-nodeagent://0",
		},
	}
	got, err = nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("node agent: node %s status: %w", node.Name, err)
	}
	// The API server's TaintNodesByCondition admission taints a new Node
	// not-ready; the node lifecycle controller lifts the taint once the
	// Node is Ready. The test cluster does not run that controller, so
	// the agent lifts it.
	kept := got.Spec.Taints[:0:0]
	for _, t := range got.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			kept = append(kept, t)
		}
	}
	if len(kept) != len(got.Spec.Taints) {
		got.Spec.Taints = kept
		if got, err = nodes.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node agent: node %s: lift the not-ready taint: %w", node.Name, err)
		}
	}
	a.node = got
	return nil
}

// createLease creates (or takes over) the node's Lease in kube-node-lease,
// the heartbeat the node lifecycle controller watches.
func (a *Agent) createLease(ctx context.Context) (*coordinationv1.Lease, error) {
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: a.node.Name, UID: a.node.UID,
		}}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(a.cfg.NodeName),
			LeaseDurationSeconds: ptr.To(int32(a.cfg.LeaseDuration / time.Second)),
			RenewTime:            &metav1.MicroTime{Time: a.clock.Now()},
		},
	}
	got, err := leases.Create(ctx, l, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = leases.Get(ctx, l.Name, metav1.GetOptions{})
		if err == nil {
			got.Spec, got.OwnerReferences = l.Spec, l.OwnerReferences
			got, err = leases.Update(ctx, got, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("node agent: node lease %s: %w", l.Name, err)
	}
	return got, nil
}

// heartbeat renews the node Lease every quarter of its duration.
func (a *Agent) heartbeat(ctx context.Context, lease *coordinationv1.Lease) {
	t := a.clock.NewTicker(a.cfg.LeaseDuration / 4)
	defer t.Stop()
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		l := lease.DeepCopy()
		l.Spec.RenewTime = &metav1.MicroTime{Time: a.clock.Now()}
		got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			got, err = a.createLease(ctx)
		}
		if err != nil {
			a.log.Warn("renew node lease", "err", err)
			continue
		}
		lease = got
	}
}

// watchPods runs an informer over the Pods bound to the node and hands
// each Pod to its worker.
func (a *Agent) watchPods(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				a.podGone(p.UID)
			}
		},
	}); err != nil {
		return fmt.Errorf("node agent: %w", err)
	}
	f.Start(ctx.Done())
	a.wg.Add(1)
	go func() { defer a.wg.Done(); <-ctx.Done(); f.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("node agent: pod informer did not sync")
	}
	return nil
}

func (a *Agent) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.workers[pod.UID]
	if !ok {
		if a.stopped {
			return
		}
		w = newPodWorker(a, pod)
		a.workers[pod.UID] = w
		a.wg.Add(1)
		go func() { defer a.wg.Done(); w.run(ctx) }()
	}
	w.update(pod)
}

// podGone tells a Pod's worker that the Pod is gone from the API; the
// worker stays in the map until then, so that a late update for a Pod it
// already removed does not start it again.
func (a *Agent) podGone(uid types.UID) {
	a.mu.Lock()
	w, ok := a.workers[uid]
	delete(a.workers, uid)
	a.mu.Unlock()
	if ok {
		w.update(nil)
	}
}

func (a *Agent) worker(namespace, name string) (*podWorker, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range a.workers {
		if w.namespace == namespace && w.name == name {
			return w, nil
		}
	}
	return nil, fmt.Errorf("pod %s/%s: not on node %s", namespace, name, a.cfg.NodeName)
}

// Exec runs argv in a running container of a Pod on this node, in its
// namespaces and environment, as `kubectl exec` would, and returns its
// exit code and (bounded) combined output.
func (a *Agent) Exec(ctx context.Context, namespace, pod, container string, argv []string, timeout time.Duration) (containerinit.ExecResult, error) {
	w, err := a.worker(namespace, pod)
	if err != nil {
		return containerinit.ExecResult{}, err
	}
	sock, err := w.execSocket(container)
	if err != nil {
		return containerinit.ExecResult{}, err
	}
	return containerinit.Exec(ctx, sock, containerinit.ExecRequest{Argv: argv, Timeout: timeout})
}

// LogPath is the file that holds a container's output (stdout and stderr,
// every restart appended), as `kubectl logs` would show it.
func (a *Agent) LogPath(namespace, pod, container string) (string, error) {
	w, err := a.worker(namespace, pod)
	if err != nil {
		return "", err
	}
	return filepath.Join(w.dir, "logs", container+".log"), nil
}

// StartTest starts an agent for t (RootDir defaults to a directory of
// t's, Logger to t's log) and stops it when t ends.
func StartTest(t testing.TB, cfg Config) *Agent {
	t.Helper()
	if cfg.RootDir == "" {
		cfg.RootDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// tWriter writes log lines to t until it ends.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
