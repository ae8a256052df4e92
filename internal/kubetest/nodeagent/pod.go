package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// setUpRetry is how long a Pod whose volumes or containers cannot be set
// up (a Secret not there yet, an unknown image) waits before trying again.
const setUpRetry = time.Second

// podWorker owns one Pod on the node: one goroutine (run) that sets the
// Pod up, starts and restarts its containers, applies probe results,
// writes its status, and tears it down.
type podWorker struct {
	a         *Agent
	log       *slog.Logger
	uid       types.UID
	namespace string
	name      string
	dir       string

	mailbox chan struct{} // a new pod in latest
	lmu     sync.Mutex
	latest  *corev1.Pod // nil: gone from the API
	gone    bool

	events chan event
	done   chan struct{} // closed when run returns

	// Owned by run.
	pod        *corev1.Pod
	ip         netip.Addr
	volumes    map[string]string
	ready      bool // the sandbox (IP, directories, volumes) is set up
	setUpErr   error
	startTime  metav1.Time
	inits      []*container // init containers, run in order to success first
	containers []*container
	written    *corev1.PodStatus

	smu     sync.Mutex
	sockets map[string]string // running container → its init's exec socket
}

// An event is something a container's goroutines report to run.
type event struct {
	c     *container
	gen   int
	exit  *int       // the container's process exited with this code
	probe *probeKind // a probe result
	ok    bool
	msg   string
}

func newPodWorker(a *Agent, pod *corev1.Pod) *podWorker {
	return &podWorker{
		a: a, log: a.log.With("pod", pod.Namespace+"/"+pod.Name, "podUID", pod.UID),
		uid: pod.UID, namespace: pod.Namespace, name: pod.Name,
		dir:     filepath.Join(a.cfg.RootDir, "pods", string(pod.UID)),
		mailbox: make(chan struct{}, 1), events: make(chan event), done: make(chan struct{}),
		sockets: map[string]string{},
	}
}

// update hands run the Pod's latest state (nil: gone from the API).
func (w *podWorker) update(pod *corev1.Pod) {
	w.lmu.Lock()
	if pod == nil {
		w.gone = true
	} else if !w.gone {
		w.latest = pod
	}
	w.lmu.Unlock()
	select {
	case w.mailbox <- struct{}{}:
	default:
	}
}

func (w *podWorker) run(ctx context.Context) {
	defer close(w.done)
	defer w.cleanUp()
	w.startTime = metav1.NewTime(w.a.clock.Now())
	var wake <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			w.killAll(0)
			return
		case <-w.mailbox:
			w.lmu.Lock()
			gone, latest := w.gone, w.latest
			w.lmu.Unlock()
			if gone {
				// Deleted without us (force deletion): nothing is waited for.
				w.killAll(0)
				return
			}
			w.pod = latest
		case ev := <-w.events:
			w.apply(ev)
		case <-wake:
		}
		if w.pod.DeletionTimestamp != nil {
			w.terminate(ctx)
			return
		}
		next := w.sync(ctx)
		wake = nil
		if next > 0 {
			wake = w.a.clock.After(next)
		}
	}
}

// sync brings the Pod's processes towards its spec and writes its status
// if it changed. It returns when it wants to run again (0: on an event).
func (w *podWorker) sync(ctx context.Context) time.Duration {
	var next time.Duration
	if !w.ready {
		if err := w.setUp(ctx); err != nil {
			if w.setUpErr == nil || w.setUpErr.Error() != err.Error() {
				w.log.Warn("set up pod", "err", err)
			}
			w.setUpErr = err
			next = setUpRetry
		} else {
			w.ready, w.setUpErr = true, nil
		}
	}
	if w.ready {
		now := w.a.clock.Now()
		// Init containers one at a time, each to success, before any other.
		for _, c := range w.inits {
			if c.succeeded() {
				continue
			}
			if c.proc == nil && c.shouldRun(w.pod.Spec.RestartPolicy) {
				next = minPositive(next, w.startAt(ctx, c, now))
			}
			break
		}
		for _, c := range w.containers {
			if !w.initialized() || c.proc != nil || !c.shouldRun(w.pod.Spec.RestartPolicy) {
				continue
			}
			next = minPositive(next, w.startAt(ctx, c, now))
		}
	}
	if !w.writeStatus(ctx) {
		next = minPositive(next, setUpRetry) // the API server may be away: try again
	}
	return next
}

// startAt starts c unless its back-off has not ended at now; it returns
// when to look again (0: on an event).
func (w *podWorker) startAt(ctx context.Context, c *container, now time.Time) time.Duration {
	if wait := c.nextStart.Sub(now); wait > 0 {
		c.waitingReason = "CrashLoopBackOff"
		return wait
	}
	if err := w.start(ctx, c); err != nil {
		w.log.Warn("start container", "container", c.spec.Name, "err", err)
		c.waitingReason, c.waitingMessage = "CreateContainerError", err.Error()
		c.nextStart = now.Add(setUpRetry)
		return setUpRetry
	}
	return 0
}

// initialized reports whether every init container has succeeded.
func (w *podWorker) initialized() bool {
	for _, c := range w.inits {
		if !c.succeeded() {
			return false
		}
	}
	return true
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || b < a {
		return b
	}
	return a
}

// setUp gives the Pod its IP, directory and volumes.
func (w *podWorker) setUp(ctx context.Context) error {
	if !w.ip.IsValid() {
		ip, err := w.a.cfg.IPs.Allocate()
		if err != nil {
			return err
		}
		w.ip = ip
	}
	for _, d := range []string{w.dir, filepath.Join(w.dir, "logs"), filepath.Join(w.dir, "containers")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := w.setUpVolumes(ctx); err != nil {
		return err
	}
	if w.containers == nil {
		for i := range w.pod.Spec.InitContainers {
			w.inits = append(w.inits, &container{spec: w.pod.Spec.InitContainers[i], w: w, init: true})
		}
		for i := range w.pod.Spec.Containers {
			w.containers = append(w.containers, &container{spec: w.pod.Spec.Containers[i], w: w})
		}
	}
	return nil
}

// apply records what a container's goroutines reported.
func (w *podWorker) apply(ev event) {
	c := ev.c
	if ev.gen != c.gen {
		return // from an earlier run of the container
	}
	switch {
	case ev.exit != nil:
		c.exited(*ev.exit)
	case ev.probe != nil:
		if !ev.ok {
			w.log.Debug("probe failed", "container", c.spec.Name, "probe", *ev.probe, "msg", ev.msg)
		}
		if c.probeResult(*ev.probe, ev.ok) {
			w.log.Info("liveness probe failed: restarting the container", "container", c.spec.Name, "msg", ev.msg)
			c.stop(0)
		}
	}
}

// terminate stops every container within the Pod's grace period and
// removes the Pod from the API, as the kubelet does once its containers
// are gone.
func (w *podWorker) terminate(ctx context.Context) {
	grace := 30 * time.Second
	if g := w.pod.DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	w.killAll(grace)
	// Retried until it is done: nothing else would remove the Pod.
	for {
		err := w.a.client.CoreV1().Pods(w.namespace).Delete(ctx, w.name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: ptr.To(w.uid)},
		})
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) || ctx.Err() != nil {
			return
		}
		w.log.Warn("remove pod", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-w.a.clock.After(setUpRetry):
		}
	}
}

// killAll stops every container at once: SIGTERM to each (its init
// forwards it to the command), SIGKILL to those left after grace.
func (w *podWorker) killAll(grace time.Duration) {
	var wg sync.WaitGroup
	for _, c := range append(slices.Clip(w.inits), w.containers...) {
		c.noRestart = true
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(grace) }()
	}
	wg.Wait()
}

func (w *podWorker) cleanUp() {
	w.killAll(0)
	if w.ip.IsValid() {
		w.a.cfg.IPs.Release(w.ip)
	}
	// The containers' roots were only ever mounted in their own mount
	// namespaces, gone with them.
	if err := os.RemoveAll(filepath.Join(w.dir, "containers")); err != nil {
		w.log.Warn("remove pod directory", "err", err)
	}
	if err := os.RemoveAll(filepath.Join(w.dir, "volumes")); err != nil {
		w.log.Warn("remove pod directory", "err", err)
	}
}

func (w *podWorker) execSocket(container string) (string, error) {
	w.smu.Lock()
	defer w.smu.Unlock()
	s, ok := w.sockets[container]
	if !ok {
		return "", fmt.Errorf("pod %s/%s: container %q is not running", w.namespace, w.name, container)
	}
	return s, nil
}
