package kubegateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	pb "stoke.dev/stoke/api/executor/v1"
	rdpb "stoke.dev/stoke/api/runtimed/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
)

// heldRuns holds its watches' events back until its gate opens, which
// the first Get after arm opens: the gateway's Run informer deliberately
// behind the API server, by a hook rather than by timing, and caught up
// only once the route has read the API server.
type heldRuns struct {
	store.Resource[*v1alpha1.Run]
	mu   sync.Mutex
	gate chan struct{}
	gets int
}

// Get reads the API server, then lets the watch events through.
func (h *heldRuns) Get(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	obj, err := h.Resource.Get(ctx, namespace, name)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gets++
	select {
	case <-h.gate:
	default:
		close(h.gate)
	}
	return obj, err
}

func (h *heldRuns) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	w, err := h.Resource.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := &heldWatch{w: w, out: make(chan store.Event[*v1alpha1.Run]), stop: make(chan struct{})}
	go func() {
		defer close(out.out)
		for ev := range w.Events() {
			select {
			case <-h.gate:
			case <-out.stop:
				return
			case <-ctx.Done():
				return
			}
			select {
			case out.out <- ev:
			case <-out.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

type heldWatch struct {
	w    store.Watcher[*v1alpha1.Run]
	out  chan store.Event[*v1alpha1.Run]
	once sync.Once
	stop chan struct{}
}

func (h *heldWatch) Events() <-chan store.Event[*v1alpha1.Run] { return h.out }

func (h *heldWatch) Stop() {
	h.once.Do(func() { close(h.stop) })
	h.w.Stop()
	for range h.out {
	}
}

// echoPod is a runtime Pod's hop (runtimed's side): invocations echo
// their input, and every Run's log is one record.
type echoPod struct {
	pb.UnimplementedFunctionRuntimeServer
	rdpb.UnimplementedLogsServer
}

func (echoPod) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	return &pb.InvokeFunctionResponse{Output: req.GetInput(), InvocationId: req.GetInvocationId()}, nil
}

func (echoPod) ReadLog(req *rdpb.ReadLogRequest, s grpc.ServerStreamingServer[rdpb.ReadLogResponse]) error {
	return s.Send(&rdpb.ReadLogResponse{Data: []byte(`{"stream":"stdout","line":"from ` + req.GetRunUid() + `"}` + "\n")})
}

// A Run created and made Ready (or Running) on its pod through the API
// server while the gateway's Run informer is held behind: an invocation,
// an exec and a log read each find it (the route reads the API server on
// its miss and waits for the informer's event, which the hook releases
// only after that read) and reach its pod; a Run the API server does not
// have stays NotFound, and reading it released nothing. Before the route
// read the API server, each of these calls was a 404.
func TestRoutesFindARunTheInformerHasNotSeen(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "lag"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := kube.New(c.Config, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterFunctionRuntimeServer(srv, echoPod{})
	rdpb.RegisterLogsServer(srv, echoPod{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	hops := newHops(port, func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	})
	defer hops.close()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-1", UID: "pod-uid-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}}
	hops.set(pod)

	// held starts a Run informer held behind the API server.
	heldWith := func(t *testing.T, opts informer.Options) (*routes, *heldRuns) {
		res := &heldRuns{Resource: st.Runs(), gate: make(chan struct{})}
		inf := informer.New[*v1alpha1.Run](res, opts)
		ictx, icancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- inf.Run(ictx) }()
		t.Cleanup(func() { icancel(); <-done })
		if err := inf.WaitForSync(ctx); err != nil {
			t.Fatal(err)
		}
		return &routes{runs: inf, hops: hops}, res
	}
	held := func(t *testing.T) (*routes, *heldRuns) { return heldWith(t, informer.Options{}) }
	// onPod creates a Run and puts it in phase on pod-1, while held.
	onPod := func(t *testing.T, rt *routes, run *v1alpha1.Run, phase v1alpha1.Phase) *v1alpha1.Run {
		run.Namespace = ns
		created, err := st.Runs().Create(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Phase = phase
		created.Status.AssignedPod, created.Status.AssignedPodUID = pod.Name, string(pod.UID)
		updated, err := st.Runs().UpdateStatus(ctx, created)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rt.runs.Get(ns, run.Name); ok {
			t.Fatal("the held informer has the Run already: the hook does not hold it")
		}
		return updated
	}
	task := func(name string) *v1alpha1.Run {
		return &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"sleep", "60"}}}}}
	}
	function := func(name string) *v1alpha1.Run {
		return &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}}}}
	}

	t.Run("invoke", func(t *testing.T) {
		rt, _ := held(t)
		fn := onPod(t, rt, function("fn"), v1alpha1.PhaseReady)
		hop, err := rt.Route(ns, "fn", string(fn.UID))
		if err != nil {
			t.Fatalf("invoke right after the create: %v", err)
		}
		resp, err := hop.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Input: []byte(`"hi"`)})
		if err != nil || string(resp.GetOutput()) != `"hi"` {
			t.Fatalf("the invocation through the route: %q, %v", resp.GetOutput(), err)
		}
	})
	t.Run("exec", func(t *testing.T) {
		rt, _ := held(t)
		task := onPod(t, rt, task("task"), v1alpha1.PhaseRunning)
		_, uid, err := rt.ExecRoute(ns, "task")
		if err != nil || uid != string(task.UID) {
			t.Fatalf("exec right after the create: uid %q, %v; want uid %s", uid, err, task.UID)
		}
	})
	t.Run("log", func(t *testing.T) {
		rt, _ := held(t)
		fn := onPod(t, rt, function("logged"), v1alpha1.PhaseReady)
		l, err := rt.OpenLog(ctx, ns, "logged", false)
		if err != nil {
			t.Fatalf("log right after the create: %v", err)
		}
		defer l.Close()
		line, err := l.Next(ctx)
		if err != nil || string(line) != `{"stream":"stdout","line":"from `+string(fn.UID)+`"}`+"\n" {
			t.Fatalf("the log through the route: %q, %v", line, err)
		}
	})
	t.Run("real miss", func(t *testing.T) {
		rt, res := held(t)
		_, err := rt.Route(ns, "nobody", "some-uid")
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("invoke of a Run nobody made: %v, want NotFound", err)
		}
		if _, _, err := rt.ExecRoute(ns, "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("exec of a Run nobody made: %v, want NotFound", err)
		}
		if res.gets != 2 {
			t.Fatalf("the misses read the API server %d times, want once each (2)", res.gets)
		}
	})
	// The gateway's own informer holds the Ready Runs alone: a task Run's
	// exec and log read it from the API server, and once the informer has
	// caught up with a Ready Run written after the task Run, no task Run
	// is in its memory. Fails when the gateway watches every Run again.
	t.Run("task Runs stay out of memory", func(t *testing.T) {
		rt, _ := heldWith(t, runInformerOptions(Config{}, nil))
		tk := onPod(t, rt, task("quiet-task"), v1alpha1.PhaseRunning)
		fn := onPod(t, rt, function("ready-fn"), v1alpha1.PhaseReady)
		_, uid, err := rt.ExecRoute(ns, "quiet-task")
		if err != nil || uid != string(tk.UID) {
			t.Fatalf("exec of a task Run: uid %q, %v; want uid %s", uid, err, tk.UID)
		}
		l, err := rt.OpenLog(ctx, ns, "quiet-task", false)
		if err != nil {
			t.Fatalf("log of a task Run: %v", err)
		}
		line, err := l.Next(ctx)
		l.Close()
		if err != nil || string(line) != `{"stream":"stdout","line":"from `+string(tk.UID)+`"}`+"\n" {
			t.Fatalf("the task Run's log through the route: %q, %v", line, err)
		}
		if _, err := rt.Route(ns, "ready-fn", string(fn.UID)); err != nil {
			t.Fatalf("invoke of a Ready function Run: %v", err)
		}
		inf := rt.runs.(*informer.Informer[*v1alpha1.Run])
		for _, r := range inf.List(func(*v1alpha1.Run) bool { return true }) {
			if r.Spec.Mode.Task != nil || r.Status.Phase != v1alpha1.PhaseReady {
				t.Errorf("the gateway's informer holds %s/%s (%s): it watches more than the Ready Runs", r.Namespace, r.Name, r.Status.Phase)
			}
		}
	})
}
