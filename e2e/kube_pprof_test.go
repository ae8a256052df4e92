package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/internal/controller"
	"stoke.dev/stoke/internal/runtimeset"
)

// kubePprof, when set, is where BenchmarkKube/Throughput and
// BenchmarkKubeGateway/WarmInvoke write a CPU profile of every stoke
// process and of the API server, taken over the first -kube-pprof-seconds
// of the load.
// kubeTrace, when set, is where BenchmarkKubeGateway/WarmInvoke writes a
// Go execution trace of every stoke process over the same time (the
// gateways' scheduling, GC and blocking, call by call); kubeSched, the
// file it writes the kernel's account of each call's processes to.
var (
	kubePprof        = flag.String("kube-pprof", "", "directory for CPU profiles of every stoke process during BenchmarkKube/Throughput and BenchmarkKubeGateway/WarmInvoke")
	kubePprofSeconds = flag.Int("kube-pprof-seconds", 20, "how long the -kube-pprof profiles and -kube-trace traces last")
	kubeTrace        = flag.String("kube-trace", "", "directory for Go execution traces of every stoke process during BenchmarkKubeGateway/WarmInvoke")
	kubeSched        = flag.String("kube-sched", "", "BenchmarkKubeGateway/WarmInvoke: write to this file each path process's CPU and run-queue wait (/proc's schedstat) during the slowest gateway calls, and their percentiles")
)

// debugTarget is one stoke process's debug socket in a Pod.
type debugTarget struct {
	namespace, pod, container, socket string
}

// debugTargets are the debug sockets of the controller replicas and of
// every runtime Pod's two containers.
// gatewayDebugSocket is where the chart's gateway serves its profiles
// (stoke gateway's default --debug-socket).
const gatewayDebugSocket = "/var/run/stoke-gateway/run/debug/debug.sock"

func (e *kubeEnv) debugTargets(t testing.TB) []debugTarget {
	t.Helper()
	var out []debugTarget
	// stoke-system holds the controllers and, installed by the chart, the
	// gateways: each by its own label, container and socket.
	for _, role := range []struct{ label, container, socket string }{
		{controllerName, "controller", controller.DefaultDebugSocket},
		{"stoke-gateway", "gateway", gatewayDebugSocket},
	} {
		pods, err := e.kube.CoreV1().Pods(stokeNamespace).List(context.Background(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=" + role.label,
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			out = append(out, debugTarget{p.Namespace, p.Name, role.container, role.socket})
		}
	}
	rts, err := e.kube.CoreV1().Pods(runsNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: runtimeset.LabelName + "=" + runtimeset.NameRuntimePod,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rts.Items {
		out = append(out,
			debugTarget{p.Namespace, p.Name, runtimeset.ContainerRuntimed, runtimeset.RuntimedDebugSocket},
			debugTarget{p.Namespace, p.Name, runtimeset.ContainerRuntimeServer, runtimeset.RuntimeServerDebugSocket})
	}
	return out
}

// pprof copies a profile from target's debug socket into the file out, as
// an operator would: `stoke debug pprof` run in the container (the node
// agent's exec, kubectl exec's stand-in) writes it beside the socket, in
// the Pod's emptyDir, which this host reads.
func (e *kubeEnv) pprof(ctx context.Context, target debugTarget, profile string, seconds int, out string) error {
	pod, err := e.kube.CoreV1().Pods(target.namespace).Get(ctx, target.pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	inPod := path.Join(path.Dir(target.socket), "e2e-"+profile+".pprof")
	host, err := e.hostPath(pod, target.container, inPod)
	if err != nil {
		return err
	}
	for _, a := range e.agents {
		if a.NodeName() != pod.Spec.NodeName {
			continue
		}
		argv := []string{"stoke", "debug", "pprof", "--socket", target.socket, "--output", inPod, "--seconds", strconv.Itoa(seconds), profile}
		res, err := a.Exec(ctx, pod.Namespace, pod.Name, target.container, argv, time.Duration(seconds)*time.Second+time.Minute)
		if err != nil {
			return err
		}
		if res.ExitCode != 0 || res.Error != "" {
			return fmt.Errorf("%s/%s: %q exited %d (%s): %s", pod.Name, target.container, argv, res.ExitCode, res.Error, res.Output)
		}
		b, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		os.Remove(host)
		return os.WriteFile(out, b, 0o600)
	}
	return fmt.Errorf("pod %s is on node %q, which no agent runs", pod.Name, pod.Spec.NodeName)
}

// hostPath is where the file at p in a container of pod lies on this
// host: p must be in an emptyDir volume, which the node agent keeps under
// pods/UID/volumes/NAME of its root.
func (e *kubeEnv) hostPath(pod *corev1.Pod, container, p string) (string, error) {
	root := ""
	for i, a := range e.agents {
		if a.NodeName() == pod.Spec.NodeName {
			root = e.roots[i]
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		for _, m := range c.VolumeMounts {
			if rel, ok := strings.CutPrefix(p, m.MountPath+"/"); ok && root != "" {
				return filepath.Join(root, "pods", string(pod.UID), "volumes", m.Name, filepath.FromSlash(rel)), nil
			}
		}
	}
	return "", fmt.Errorf("%s in %s/%s is in no volume of a node agent's", p, pod.Name, container)
}

// profileAll takes a CPU profile of every stoke process for seconds into
// dir (POD-CONTAINER.pprof), and of the API server if it serves profiles
// (kube-apiserver.pprof); it returns at once, and wait returns when every
// profile is written, logging those that failed.
func (e *kubeEnv) profileAll(b testing.TB, dir string, seconds int) (wait func()) {
	b.Helper()
	return e.collectAll(b, dir, "profile", seconds)
}

// traceAll is profileAll's Go execution traces (POD-CONTAINER.trace),
// without the API server's.
func (e *kubeEnv) traceAll(b testing.TB, dir string, seconds int) (wait func()) {
	b.Helper()
	return e.collectAll(b, dir, "trace", seconds)
}

// collectAll takes profile ("profile" or "trace") of every stoke process,
// and the API server's CPU profile with "profile".
func (e *kubeEnv) collectAll(b testing.TB, dir, profile string, seconds int) (wait func()) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, fmt.Sprintf("%s: %v", what, err))
	}
	for _, tg := range e.debugTargets(b) {
		wg.Go(func() {
			ext := ".pprof"
			if profile == "trace" {
				ext = ".trace"
			}
			out := filepath.Join(dir, tg.pod+"-"+tg.container+ext)
			if err := e.pprof(context.Background(), tg, profile, seconds, out); err != nil {
				fail(out, err)
			}
		})
	}
	wg.Go(func() {
		if profile != "profile" {
			return
		}
		raw, err := e.kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).Timeout(time.Duration(seconds)*time.Second + time.Minute).DoRaw(context.Background())
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "kube-apiserver.pprof"), raw, 0o600)
		}
		if err != nil {
			fail("kube-apiserver (started with --profiling=false?)", err)
		}
	})
	return func() {
		wg.Wait()
		for _, f := range failed {
			b.Logf("profile: %s", f)
		}
		b.Logf("%ss of %ds in %s", profile, seconds, dir)
	}
}

// Every stoke process of the installation serves its profiles on its
// debug socket, and `stoke debug pprof` in its container copies one.
func testProfiles(t *testing.T, e *kubeEnv) {
	targets := e.debugTargets(t)
	if len(targets) < 4 {
		t.Fatalf("debug sockets of %d processes, want the controllers', the gateways' and at least one runtime Pod's", len(targets))
	}
	dir := t.TempDir()
	for _, tg := range targets {
		out := filepath.Join(dir, tg.pod+"-"+tg.container+".pprof")
		if err := e.pprof(t.Context(), tg, "heap", 0, out); err != nil {
			t.Fatalf("%s/%s: %v", tg.pod, tg.container, err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s/%s: the heap profile is not gzipped protobuf (%d bytes)", tg.pod, tg.container, len(b))
		}
	}
}
