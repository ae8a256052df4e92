// Package kubepods is the pod source of `stoke controller`: a
// podsource.Source over the runtime Pods of a Kubernetes cluster (label
// stoke.dev/runtime=<Runtime name>) and the coordination Leases their
// runtimed sidecars renew (named after the Pod, held by the Pod's UID).
//
// A Pod is announced ready (PodReady, Slots = its Runtime's spec.runs,
// Server and Lambda from the Runtime's spec, Addr = runtimed's hop at
// <pod IP>:7443) when its Ready condition is True and its Lease is fresh.
// A Pod that is alive (fresh Lease) but not Ready — starting, or failing
// its readiness probe — is announced with Slots 0: the scheduler gives it
// no new Runs, the reaper leaves its Runs alone. It is fenced (PodGone,
// by UID) when:
//   - it is deleted (deletionTimestamp set, or gone from the API), or it
//     finished (phase Succeeded or Failed): reason PodDeleted or Exited;
//   - it stays NotReady for Config.NotReadyGrace (from when this source
//     first saw it NotReady): reason NotReady;
//   - its Lease is no longer fresh: reason LeaseExpired.
//
// Freshness is judged on this process's clock, never on the renewTime a
// sidecar wrote (clocks differ): a Lease is fresh for its
// leaseDurationSeconds after this source last saw it change, and after
// the source itself could last reach the API server again (its start, or
// the end of an outage), so that an API server that was down, or a watch
// that lagged, never reads as a dead Pod. Before fencing for LeaseExpired
// the source reads the Lease from the API server itself; if the read fails
// it tries again a second later and fences nothing meanwhile.
//
// A Pod fenced as NotReady or LeaseExpired is then deleted (with its UID
// as precondition) so that its Deployment replaces it: a UID, once gone,
// is never announced again. Events of one Pod come in order; every
// announced Pod gets exactly one PodGone, unless Run returns first — then
// the subscriptions end without PodGone, because the Pods live on.
//
// The queue of Pod keys and their timers are internal/loop's; this
// package holds the decisions (decide.go).
package kubepods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/podsource"
)

// Conventions shared with the Runtime reconciler and runtimed (KUBE.md).
const (
	// LabelRuntime names a runtime Pod's Runtime (same namespace).
	LabelRuntime = "stoke.dev/runtime"
	// HopPort is runtimed's invoke and exec hop on the Pod IP.
	HopPort = 7443
	// WorkspaceRoot is where the Runs' working directories live in a Pod.
	WorkspaceRoot = "/workspace"
	// DefaultNotReadyGrace is Config.NotReadyGrace's default.
	DefaultNotReadyGrace = 30 * time.Second
	// defaultLeaseDuration applies to a Lease without leaseDurationSeconds.
	defaultLeaseDuration = 10 * time.Second
	// apiTimeout bounds the source's own calls (a Lease read, a Pod delete).
	apiTimeout = 5 * time.Second
	// retryAfter is the wait before a failed Lease read is tried again.
	retryAfter = time.Second
)

// Config configures a Source.
type Config struct {
	// Client reads Pods and Leases (list, watch, get) and deletes fenced
	// Pods, in every namespace.
	Client kubernetes.Interface
	// Runtimes is the shared Runtime informer; the caller runs it.
	Runtimes *informer.Informer[*v1alpha1.Runtime]
	// NotReadyGrace is how long an announced Pod may stay NotReady before
	// it is fenced; zero means DefaultNotReadyGrace.
	NotReadyGrace time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
}

// Source is the pool of runtime Pods. Create it with New and drive it with
// Run; Subscribe, Pods, Lookup and Synced may be called from any
// goroutine.
type Source struct {
	cfg    Config
	log    *slog.Logger
	clk    clock.WithTicker
	hub    *podsource.Hub
	pods   cache.SharedIndexInformer
	leases cache.SharedIndexInformer
	// loop is the mechanism: Pod keys (from Pod, Lease and Runtime
	// events) and their timers.
	loop    *loop.Loop[informer.Key, struct{}, struct{}]
	synced  chan struct{}
	started atomic.Bool

	// Owned by the Run goroutine.
	state     map[informer.Key]*podState
	reachable time.Time // since when the API server answers (zero: it does not)
}

// podState is what the source remembers of one Pod name.
type podState struct {
	uid       types.UID
	announced *podsource.Pod // nil: not announced
	fenced    bool           // PodGone sent or decided: never announced again
	lease     leaseSeen
	// notReadySince is when this source first saw the Pod not Ready
	// (zero while it is Ready).
	notReadySince time.Time
}

// leaseSeen is the last state of the Pod's Lease this source saw, and
// when (on its own clock) it saw it change.
type leaseSeen struct {
	present  bool
	holder   string
	renew    time.Time
	duration time.Duration
	seenAt   time.Time
}

// byRuntime indexes Pods by "<namespace>/<Runtime name>".
const byRuntime = "runtime"

// New checks cfg and returns a Source that does nothing until Run.
func New(cfg Config) (*Source, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("kubepods: Config.Client is required")
	case cfg.Runtimes == nil:
		return nil, errors.New("kubepods: Config.Runtimes is required")
	}
	if cfg.NotReadyGrace <= 0 {
		cfg.NotReadyGrace = DefaultNotReadyGrace
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	s := &Source{
		cfg:    cfg,
		log:    cfg.Logger,
		clk:    cfg.Clock,
		hub:    podsource.NewHub(cfg.Logger),
		synced: make(chan struct{}),
		state:  map[informer.Key]*podState{},
	}
	s.loop = loop.New(loop.Config[informer.Key, struct{}, struct{}]{
		Clock: cfg.Clock,
		Hooks: loop.Hooks[informer.Key, struct{}, struct{}]{Sync: s.sync},
	})
	s.pods = coreinformers.NewFilteredPodInformer(cfg.Client, metav1.NamespaceAll, 0,
		cache.Indexers{byRuntime: func(obj any) ([]string, error) {
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return nil, nil
			}
			return []string{pod.Namespace + "/" + pod.Labels[LabelRuntime]}, nil
		}},
		func(o *metav1.ListOptions) { o.LabelSelector = LabelRuntime })
	// runtimed's Leases carry no label: every Lease is watched and those
	// not named after a runtime Pod are ignored (the others are a few per
	// node and per controller).
	s.leases = coordinationinformers.NewLeaseInformer(cfg.Client, metav1.NamespaceAll, 0, cache.Indexers{})
	enqueue := cache.ResourceEventHandlerFuncs{
		AddFunc:    s.enqueue,
		UpdateFunc: func(_, obj any) { s.enqueue(obj) },
		DeleteFunc: s.enqueue,
	}
	if _, err := s.pods.AddEventHandler(enqueue); err != nil {
		return nil, fmt.Errorf("kubepods: %w", err)
	}
	if _, err := s.leases.AddEventHandler(enqueue); err != nil {
		return nil, fmt.Errorf("kubepods: %w", err)
	}
	return s, nil
}

// enqueue queues the Pod an object is named after (a Lease bears its
// Pod's name).
func (s *Source) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return
	}
	s.loop.Add(informer.Key{Namespace: ns, Name: name})
}

// Subscribe is podsource.Source: the ready pods and their later
// transitions.
func (s *Source) Subscribe() (<-chan podsource.Event, []podsource.Pod, func()) {
	return s.hub.Subscribe()
}

// Pods returns the announced pods, sorted by name.
func (s *Source) Pods() []podsource.Pod { return s.hub.Pods() }

// Lookup returns the announced pod with this UID.
func (s *Source) Lookup(uid string) (podsource.Pod, bool) { return s.hub.Lookup(uid) }

// Synced is closed once Run has listed the Pods, Leases and Runtimes and
// announced the Pods that are ready: a subscriber that starts after it
// sees every live Pod in its snapshot.
func (s *Source) Synced() <-chan struct{} { return s.synced }

// Run follows Pods, Leases and Runtimes until ctx ends, then ends the
// subscriptions (without PodGone) and returns nil once its informers have
// stopped. It may be called once.
func (s *Source) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("kubepods: Run called twice")
	}
	defer s.hub.End()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, inf := range []cache.SharedIndexInformer{s.pods, s.leases} {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	if !cache.WaitForCacheSync(ctx.Done(), s.pods.HasSynced, s.leases.HasSynced) {
		return nil
	}
	if err := s.cfg.Runtimes.WaitForSync(ctx); err != nil {
		return nil
	}
	remove := s.cfg.Runtimes.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Runtime]{
		AddFunc:    s.runtimeChanged,
		UpdateFunc: func(_, rt *v1alpha1.Runtime) { s.runtimeChanged(rt) },
		DeleteFunc: s.runtimeChanged,
	})
	defer remove()

	s.reachable = s.clk.Now()
	for _, key := range s.pods.GetIndexer().ListKeys() {
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			s.loop.Add(informer.Key{Namespace: ns, Name: name})
		}
	}
	s.loop.SyncQueued(ctx)
	close(s.synced)
	return s.loop.Run(ctx, nil)
}

// runtimeChanged queues the Pods of a Runtime (slots, server).
func (s *Source) runtimeChanged(rt *v1alpha1.Runtime) {
	keys, err := s.pods.GetIndexer().IndexKeys(byRuntime, rt.Namespace+"/"+rt.Name)
	if err != nil {
		return
	}
	for _, key := range keys {
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			s.loop.Add(informer.Key{Namespace: ns, Name: name})
		}
	}
}

// sync decides one Pod from the informers' current state.
func (s *Source) sync(ctx context.Context, k informer.Key) {
	now := s.clk.Now()
	st := s.state[k]
	obj, exists, _ := s.pods.GetIndexer().GetByKey(k.Namespace + "/" + k.Name)
	pod, _ := obj.(*corev1.Pod)
	if !exists || pod == nil {
		if st != nil {
			s.fence(st, podsource.ReasonPodDeleted)
			delete(s.state, k)
		}
		return
	}
	if st != nil && st.uid != pod.UID {
		// Another Pod of the same name: the old one is deleted.
		s.fence(st, podsource.ReasonPodDeleted)
		st = nil
	}
	if st == nil {
		st = &podState{uid: pod.UID}
		s.state[k] = st
	}
	if st.fenced {
		return
	}
	s.observeLease(st, s.lease(k), now)
	rt, _ := s.cfg.Runtimes.Get(pod.Namespace, pod.Labels[LabelRuntime])
	switch {
	case ready(pod):
		st.notReadySince = time.Time{}
	case st.notReadySince.IsZero():
		st.notReadySince = now
	}
	deadline := st.notReadySince.Add(s.cfg.NotReadyGrace)
	v := decide(pod, rt, s.leaseView(st, pod), now, deadline, st.announced != nil)
	if v.gone == podsource.ReasonLeaseExpired {
		// Ask the API server itself before fencing: the watch may lag,
		// or the API server may be what is down.
		lease, err := s.readLease(ctx, k)
		if err != nil {
			s.log.Warn("kubepods: cannot read a Lease that looks expired; fencing nothing meanwhile",
				"pod", k.String(), "pod_uid", pod.UID, "err", err)
			s.reachable = time.Time{}
			s.loop.After(now.Add(retryAfter), k)
			return
		}
		if s.reachable.IsZero() {
			s.reachable = now
		}
		s.observeLease(st, lease, now)
		v = decide(pod, rt, s.leaseView(st, pod), now, deadline, st.announced != nil)
	}
	switch {
	case v.gone != "":
		if v.gone == podsource.ReasonNotReady || v.gone == podsource.ReasonLeaseExpired {
			s.deletePod(ctx, pod)
		}
		s.fence(st, v.gone)
		return
	case v.announce:
		p := podOf(pod, rt, v.slots)
		if st.announced == nil || !reflect.DeepEqual(*st.announced, p) {
			if st.announced == nil {
				s.log.Info("kubepods: pod announced", "pod", k.String(), "pod_uid", p.UID, "slots", p.Slots)
			}
			st.announced = &p
			s.hub.Publish(podsource.Event{Type: podsource.PodReady, Pod: p})
		}
	}
	if !v.recheck.IsZero() {
		s.loop.After(v.recheck, k)
	}
}

// fence sends PodGone for an announced pod (once) and marks it so that it
// is never announced again.
func (s *Source) fence(st *podState, reason string) {
	if st.fenced {
		return
	}
	st.fenced = true
	if st.announced == nil {
		return
	}
	s.log.Info("kubepods: pod gone", "pod", st.announced.Namespace+"/"+st.announced.Name, "pod_uid", st.uid, "reason", reason)
	s.hub.Publish(podsource.Event{Type: podsource.PodGone, Pod: *st.announced, Reason: reason})
}

// lease returns the Pod's Lease from the informer, or nil.
func (s *Source) lease(k informer.Key) *coordinationv1.Lease {
	obj, exists, _ := s.leases.GetIndexer().GetByKey(k.Namespace + "/" + k.Name)
	if !exists {
		return nil
	}
	lease, _ := obj.(*coordinationv1.Lease)
	return lease
}

// readLease reads the Pod's Lease from the API server (nil: none).
func (s *Source) readLease(ctx context.Context, k informer.Key) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	lease, err := s.cfg.Client.CoordinationV1().Leases(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return lease, err
}

// observeLease records lease as seen at now if it differs from what was
// seen last.
func (s *Source) observeLease(st *podState, lease *coordinationv1.Lease, now time.Time) {
	if lease == nil {
		st.lease = leaseSeen{}
		return
	}
	seen := leaseSeen{present: true, duration: defaultLeaseDuration}
	if h := lease.Spec.HolderIdentity; h != nil {
		seen.holder = *h
	}
	if r := lease.Spec.RenewTime; r != nil {
		seen.renew = r.Time
	}
	if d := lease.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		seen.duration = time.Duration(*d) * time.Second
	}
	seen.seenAt = st.lease.seenAt
	if !st.lease.present || st.lease.holder != seen.holder || !st.lease.renew.Equal(seen.renew) || st.lease.duration != seen.duration {
		seen.seenAt = now
	}
	st.lease = seen
}

// leaseView judges the Pod's Lease: held by the Pod, and fresh for its
// duration after the later of its last change and the moment the API
// server could be reached again.
func (s *Source) leaseView(st *podState, pod *corev1.Pod) leaseView {
	l := st.lease
	if !l.present || l.holder != string(pod.UID) {
		return leaseView{}
	}
	from := l.seenAt
	if s.reachable.After(from) {
		from = s.reachable
	}
	return leaseView{held: true, freshTill: from.Add(l.duration)}
}

// deletePod deletes a fenced Pod, if it is still the same Pod, so that
// its Deployment replaces it.
func (s *Source) deletePod(ctx context.Context, pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	uid := pod.UID
	err := s.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		s.log.Warn("kubepods: cannot delete a fenced pod", "pod", pod.Namespace+"/"+pod.Name, "pod_uid", uid, "err", err)
	}
}
