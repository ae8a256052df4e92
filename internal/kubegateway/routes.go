package kubegateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	rdpb "stoke.dev/stoke/api/runtimed/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/runtimeset"
)

// runCache is the Runs the gateway knows, from its informer's memory (the
// Ready ones: runInformerOptions); Fetch reads the API server on a miss
// (informer.Informer.Fetch), which is how exec and logs find a task Run.
type runCache interface {
	HasSynced() bool
	Get(namespace, name string) (*v1alpha1.Run, bool)
	Fetch(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
}

// routes is the gateway's Router, ExecRouter and LogReader: a Run from
// the Run informer, its pod's address from the Pod informer (hops), one
// hop connection per pod. Only a Run the informer does not hold asks the
// API server: one Ready a moment ago (once, then it waits for the
// informer to catch up), or one the informer does not select (a task
// Run's exec or log: one read per session start).
type routes struct {
	runs runCache
	hops *hops
}

var (
	_ gateway.Router     = (*routes)(nil)
	_ gateway.ExecRouter = (*routes)(nil)
	_ gateway.LogReader  = (*routes)(nil)
)

// run finds the Run namespace/name, NotFound when there is none (or the
// cache has not synced: Unavailable). A Run created a moment ago, which
// the API server has and the informer not yet, is waited for (bounded):
// a client that creates a Run and invokes, execs or reads its log at
// once must not be told it does not exist. Route and ExecRoute have no
// context of their caller's; informer.CatchUp bounds their wait.
func (rt *routes) run(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	if !rt.runs.HasSynced() {
		return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "the gateway is starting; run %s/%s is not routable yet", namespace, name), gateway.NotReadyRetry)
	}
	run, err := rt.runs.Fetch(ctx, namespace, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s not found", namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s/%s: %w", namespace, name, err)
	}
	return run, nil
}

// Route implements gateway.Router.
func (rt *routes) Route(namespace, name, uid string) (pb.FunctionRuntimeServer, error) {
	run, err := rt.run(context.Background(), namespace, name)
	if err != nil {
		return nil, err
	}
	if string(run.UID) != uid {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s with uid %s not found", namespace, name, uid)
	}
	return rt.hop(run)
}

// hop is a Ready function Run's hop: Route's, and each Function
// replica's (gateway.Functions).
func (rt *routes) hop(run *v1alpha1.Run) (pb.FunctionRuntimeServer, error) {
	if err := gateway.Invocable(run); err != nil {
		return nil, err
	}
	conn, err := rt.hops.conn(run)
	if err != nil {
		return nil, err
	}
	return remoteFunctions{c: pb.NewFunctionRuntimeClient(conn)}, nil
}

// remoteFunctions is runtimed's FunctionRuntime hop over gRPC, in the
// shape of the in-process hop standalone's Router gives.
type remoteFunctions struct {
	pb.UnimplementedFunctionRuntimeServer
	c pb.FunctionRuntimeClient
}

func (f remoteFunctions) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	return f.c.InvokeFunction(ctx, req)
}

// ExecRoute implements gateway.ExecRouter.
func (rt *routes) ExecRoute(namespace, name string) (exec.Executor, string, error) {
	run, err := rt.run(context.Background(), namespace, name)
	if err != nil {
		return nil, "", err
	}
	if err := gateway.Execable(run); err != nil {
		return nil, "", err
	}
	conn, err := rt.hops.conn(run)
	if err != nil {
		return nil, "", err
	}
	return exec.NewGRPCClient(conn), string(run.UID), nil
}

// OpenLog implements gateway.LogReader: the log lives in the Run's pod,
// read through runtimed; once that pod is gone, so is the log (Expired,
// 410). A Run not assigned to a pod yet has an empty log, or, followed,
// waits for the pod it gets (pendingLog).
func (rt *routes) OpenLog(ctx context.Context, namespace, name string, follow bool) (gateway.LogStream, error) {
	run, err := rt.run(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	if run.Status.AssignedPodUID == "" {
		if run.Status.Phase.Terminal() || !follow {
			return emptyLog{}, nil
		}
		return &pendingLog{rt: rt, ns: namespace, name: name, uid: string(run.UID)}, nil
	}
	return rt.openPodLog(ctx, run, follow)
}

// openPodLog opens the log of run, which is on a pod, from that pod.
func (rt *routes) openPodLog(ctx context.Context, run *v1alpha1.Run, follow bool) (gateway.LogStream, error) {
	namespace, name := run.Namespace, run.Name
	conn, err := rt.hops.conn(run)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnavailable) {
			return nil, errdefs.Errorf(errdefs.ErrExpired, "run %s/%s: its log went with its pod %s, which is gone", namespace, name, run.Status.AssignedPod)
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := rdpb.NewLogsClient(conn).ReadLog(ctx, &rdpb.ReadLogRequest{RunUid: string(run.UID), Follow: follow})
	if err != nil {
		cancel()
		return nil, hopError(run, err)
	}
	// The first message, or the refusal, before the answer's headers.
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, hopError(run, err)
	}
	return &remoteLog{stream: stream, cancel: cancel, first: first.GetData(), eof: errors.Is(err, io.EOF)}, nil
}

// hopError is a hop call's error for the gateway's caller.
func hopError(run *v1alpha1.Run, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return errdefs.Errorf(errdefs.ErrUnavailable, "run %s/%s: its runtime pod %s does not answer: %s", run.Namespace, run.Name, run.Status.AssignedPod, st.Message())
	}
	return errdefs.FromGRPC(err)
}

// logWaitPoll is how often a follower of a Run not on a pod yet looks at
// the Run, as standalone's follower looks at its Run's phase.
const logWaitPoll = 250 * time.Millisecond

// pendingLog is the followed log of a Run not on a pod yet, as `stoke
// run` follows a task it just created: its first Next waits until the Run
// is on a pod and then reads that pod's log; a Run that ends without a
// pod, or goes (or is replaced by another of its name), has an empty log.
type pendingLog struct {
	rt            *routes
	ns, name, uid string
	cur           gateway.LogStream
}

func (l *pendingLog) Next(ctx context.Context) ([]byte, error) {
	if l.cur == nil {
		tick := time.NewTicker(logWaitPoll)
		defer tick.Stop()
		for l.cur == nil {
			// A task Run is not in the informer's memory: each look
			// reads it from the API server, only until it is on a pod.
			run, err := l.rt.runs.Fetch(ctx, l.ns, l.name)
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return nil, err
			}
			switch {
			case err != nil || string(run.UID) != l.uid || (run.Status.AssignedPodUID == "" && run.Status.Phase.Terminal()):
				return nil, io.EOF
			case run.Status.AssignedPodUID != "":
				s, err := l.rt.openPodLog(ctx, run, true)
				if err != nil {
					return nil, err
				}
				l.cur = s
				continue
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-tick.C:
			}
		}
	}
	return l.cur.Next(ctx)
}

func (l *pendingLog) Close() error {
	if l.cur != nil {
		return l.cur.Close()
	}
	return nil
}

type emptyLog struct{}

func (emptyLog) Next(context.Context) ([]byte, error) { return nil, io.EOF }
func (emptyLog) Close() error                         { return nil }

// remoteLog is a ReadLog stream.
type remoteLog struct {
	stream grpc.ServerStreamingClient[rdpb.ReadLogResponse]
	cancel context.CancelFunc
	first  []byte
	eof    bool
}

func (l *remoteLog) Next(context.Context) ([]byte, error) {
	if b := l.first; len(b) > 0 {
		l.first = nil
		return b, nil
	}
	if l.eof {
		return nil, io.EOF
	}
	for {
		m, err := l.stream.Recv()
		if err != nil {
			return nil, err
		}
		if len(m.GetData()) > 0 {
			return m.GetData(), nil
		}
	}
}

func (l *remoteLog) Close() error {
	l.cancel()
	return nil
}

// hops holds one gRPC connection per runtime pod, made at its first use
// and closed when the pod goes; the pods' addresses come from the Pod
// informer.
type hops struct {
	dial func(addr string) (*grpc.ClientConn, error)
	port string

	mu    sync.RWMutex
	pods  map[string]*corev1.Pod // by UID
	conns map[string]*hopConn    // by pod UID
}

type hopConn struct {
	addr string
	conn *grpc.ClientConn
}

func newHops(port string, dial func(addr string) (*grpc.ClientConn, error)) *hops {
	return &hops{dial: dial, port: port, pods: map[string]*corev1.Pod{}, conns: map[string]*hopConn{}}
}

// conn is the connection to the hop of run's pod: Unavailable when the
// pod is gone, finished or has no address.
func (h *hops) conn(run *v1alpha1.Run) (*grpc.ClientConn, error) {
	uid := run.Status.AssignedPodUID
	h.mu.RLock()
	pod := h.pods[uid]
	h.mu.RUnlock()
	conn, ok, err := h.podConn(uid, pod)
	if !ok {
		return nil, gateway.PodGone(run)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s/%s: the hop of pod %s: %w", run.Namespace, run.Name, run.Status.AssignedPod, err)
	}
	return conn, nil
}

// podConn is the connection to pod's hop, made at its first use; ok is
// false when the pod has no live address.
func (h *hops) podConn(uid string, pod *corev1.Pod) (_ *grpc.ClientConn, ok bool, _ error) {
	addr, ok := hopAddr(pod, h.port)
	if !ok {
		return nil, false, nil
	}
	h.mu.RLock()
	c := h.conns[uid]
	h.mu.RUnlock()
	if c != nil && c.addr == addr {
		return c.conn, true, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[uid]; c != nil {
		if c.addr == addr {
			return c.conn, true, nil
		}
		_ = c.conn.Close()
		delete(h.conns, uid)
	}
	conn, err := h.dial(addr)
	if err != nil {
		return nil, true, err
	}
	h.conns[uid] = &hopConn{addr: addr, conn: conn}
	return conn, true, nil
}

// targets are the live runtime pods' hops, for scraping runtimed's
// metrics, each labelled with its namespace, Runtime and pod.
func (h *hops) targets() []metricsrpc.Target {
	h.mu.RLock()
	pods := slices.Collect(maps.Values(h.pods))
	h.mu.RUnlock()
	var out []metricsrpc.Target
	for _, pod := range pods {
		conn, ok, err := h.podConn(string(pod.UID), pod)
		if !ok || err != nil {
			continue
		}
		out = append(out, metricsrpc.Target{Conn: conn, Labels: map[string]string{
			"namespace": pod.Namespace, "runtime": pod.Labels[runtimeset.LabelRuntime], "pod": pod.Name}})
	}
	return out
}

// hopAddr is a live pod's hop address.
func hopAddr(pod *corev1.Pod, port string) (string, bool) {
	if pod == nil || pod.DeletionTimestamp != nil || pod.Status.PodIP == "" ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return "", false
	}
	return pod.Status.PodIP + ":" + port, true
}

// set records a pod as the informer has it now.
func (h *hops) set(pod *corev1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods[string(pod.UID)] = pod
}

// remove forgets a deleted pod and closes its connection.
func (h *hops) remove(uid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pods, uid)
	if c := h.conns[uid]; c != nil {
		_ = c.conn.Close()
		delete(h.conns, uid)
	}
}

// close closes every connection.
func (h *hops) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for uid, c := range h.conns {
		_ = c.conn.Close()
		delete(h.conns, uid)
	}
}
