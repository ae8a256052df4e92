package pool

import (
	"context"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// rtKey names a Runtime object.
type rtKey struct{ namespace, name string }

func (k rtKey) String() string { return k.namespace + "/" + k.name }

// pool is the supervisor's state for one Runtime object (one UID). It is
// owned by the loop goroutine.
type pool struct {
	key     rtKey
	uid     types.UID
	spec    v1alpha1.RuntimeSpec
	pods    map[string]*podRun // by pod UID: starting, ready or stopping
	deleted bool               // the Runtime is gone; the pool ends with its last pod
	// failures counts pod failures in a row; retryAt is when the next pod
	// may start.
	failures int
	retryAt  time.Time
}

// podRun is one pod: the loop's view of it plus what its goroutine shares.
type podRun struct {
	info       podsource.Pod // owned by the loop; the pod goroutine has its own copy
	pool       *pool
	started    time.Time
	readySince time.Time // zero until the pod was announced ready
	stopping   bool

	// stop is closed, after stopReason is set, to ask the pod goroutine to
	// stop the pod.
	stop       chan struct{}
	stopReason string
	// heartbeat is the UnixNano time of the last successful health check,
	// written by the pod goroutine.
	heartbeat atomic.Int64
}

// podReport is what a pod goroutine tells the loop: it became ready, or it
// is gone (its processes are dead) for reason.
type podReport struct {
	p      *podRun
	ready  bool
	reason string
}

// reasonStartFailed ends a pod that never became ready because it could
// not be started, or did not answer within StartTimeout. Such a pod was
// never announced, so the reason is only logged.
const reasonStartFailed = "StartFailed"

// rtMsg is a change from the Runtime watch: either a full list (sync) or
// one object.
type rtMsg struct {
	sync    bool
	items   []*v1alpha1.Runtime
	obj     *v1alpha1.Runtime
	deleted bool
}

// loop is the single goroutine that owns every pool; pods, the watch and
// the status writer talk to it through channels.
type loop struct {
	s       *Supervisor
	pools   map[types.UID]*pool
	current map[rtKey]*pool // the live (not deleted) pool of each Runtime name
	reports chan podReport
	status  *statusWriter
	wg      sync.WaitGroup // pod goroutines

	retry        clock.Timer // fires when a pool's backoff ends
	retryArmed   bool
	shuttingDown bool
}

func (l *loop) run(ctx context.Context) error {
	s := l.s
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	msgs := make(chan rtMsg)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		s.watch(watchCtx, msgs)
	}()
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		l.status.run()
	}()
	refresh := s.clk.NewTicker(s.cfg.StatusInterval)
	defer refresh.Stop()

	for ctx.Err() == nil {
		var retry <-chan time.Time
		if l.retryArmed {
			retry = l.retry.C()
		}
		select {
		case m := <-msgs:
			l.handleRuntime(m)
		case r := <-l.reports:
			l.handleReport(r)
		case <-retry:
			l.retryArmed = false
			for _, p := range l.pools {
				l.reconcile(p)
			}
		case <-refresh.C():
			for _, p := range l.pools {
				l.submitStatus(p)
			}
		case <-ctx.Done():
		}
	}

	// Shutdown: no more Runtime changes; stop every pod and wait until
	// each has reported that its processes are dead.
	stopWatch()
	<-watchDone
	l.shuttingDown = true
	l.retry.Stop()
	live := 0
	for _, p := range l.pools {
		for _, pr := range p.pods {
			l.stopPod(pr, podsource.ReasonShutdown)
			live++
		}
	}
	if live > 0 {
		s.log.Info("stopping pods", "pods", live)
	}
	for l.livePods() > 0 {
		l.handleReport(<-l.reports)
	}
	l.wg.Wait()
	l.status.close()
	<-statusDone
	return nil
}

func (l *loop) livePods() int {
	n := 0
	for _, p := range l.pools {
		n += len(p.pods)
	}
	return n
}

func (l *loop) handleRuntime(m rtMsg) {
	if !m.sync {
		if m.deleted {
			if p := l.current[keyOf(m.obj)]; p != nil && p.uid == m.obj.UID {
				l.remove(p, podsource.ReasonRuntimeDeleted)
			}
			return
		}
		l.upsert(m.obj)
		return
	}
	seen := make(map[rtKey]bool, len(m.items))
	for _, rt := range m.items {
		seen[keyOf(rt)] = true
		l.upsert(rt)
	}
	for key, p := range l.current {
		if !seen[key] {
			l.remove(p, podsource.ReasonRuntimeDeleted)
		}
	}
}

func keyOf(rt *v1alpha1.Runtime) rtKey {
	ns := rt.Namespace
	if ns == "" {
		ns = store.DefaultNamespace
	}
	return rtKey{ns, rt.Name}
}

// upsert applies the latest state of a Runtime object. Status-only changes
// (the supervisor's own writes) change nothing.
func (l *loop) upsert(rt *v1alpha1.Runtime) {
	key := keyOf(rt)
	p := l.current[key]
	if rt.DeletionTimestamp != nil {
		if p != nil && p.uid == rt.UID {
			l.remove(p, podsource.ReasonRuntimeDeleted)
		}
		return
	}
	if p != nil && p.uid != rt.UID {
		// Deleted and created again while we were not looking.
		l.remove(p, podsource.ReasonRuntimeDeleted)
		p = nil
	}
	if p == nil {
		p = &pool{key: key, uid: rt.UID, spec: rt.Spec, pods: make(map[string]*podRun)}
		l.pools[rt.UID] = p
		l.current[key] = p
		l.s.log.Info("runtime pool added", "runtime", key.String(), "server", rt.Spec.Server,
			"replicas", rt.Spec.Replicas, "runs", rt.Spec.Runs)
		l.reconcile(p)
		l.submitStatus(p)
		return
	}
	old := p.spec
	p.spec = rt.Spec
	sameServer := old.Server == p.spec.Server && reflect.DeepEqual(old.Lambda, p.spec.Lambda)
	sameTemplate := reflect.DeepEqual(old.Template, p.spec.Template)
	if sameServer && sameTemplate && old.Replicas == p.spec.Replicas && old.Runs == p.spec.Runs {
		return // nothing the pods depend on (most often: our own status write)
	}
	l.s.log.Info("runtime pool changed", "runtime", key.String(), "server", rt.Spec.Server,
		"replicas", rt.Spec.Replicas, "runs", rt.Spec.Runs)
	if !sameServer || !sameTemplate {
		reason := podsource.ReasonServerChanged
		if sameServer {
			reason = podsource.ReasonTemplateChanged
		}
		for _, pr := range p.pods {
			l.stopPod(pr, reason)
		}
	}
	if old.Runs != p.spec.Runs {
		for _, pr := range p.pods {
			pr.info.Slots = p.spec.Runs
			if !pr.readySince.IsZero() && !pr.stopping {
				l.s.hub.Publish(podsource.Event{Type: podsource.PodReady, Pod: pr.info})
			}
		}
	}
	l.reconcile(p)
	l.submitStatus(p)
}

// remove ends a pool: its pods are stopped, and it is forgotten once the
// last has reported.
func (l *loop) remove(p *pool, reason string) {
	if l.current[p.key] == p {
		delete(l.current, p.key)
	}
	if p.deleted {
		return
	}
	p.deleted = true
	l.s.log.Info("runtime pool removed", "runtime", p.key.String(), "pods", len(p.pods))
	for _, pr := range p.pods {
		l.stopPod(pr, reason)
	}
	if len(p.pods) == 0 {
		delete(l.pools, p.uid)
	}
}

// reconcile starts or stops pods so that p has spec.replicas of them, as
// far as its backoff allows.
func (l *loop) reconcile(p *pool) {
	if p.deleted || l.shuttingDown {
		return
	}
	var live []*podRun
	for _, pr := range p.pods {
		if !pr.stopping {
			live = append(live, pr)
		}
	}
	want := int(max(p.spec.Replicas, 0))
	if len(live) > want {
		// Stop pods that are not ready yet first, then the youngest.
		sort.Slice(live, func(i, j int) bool {
			ri, rj := !live[i].readySince.IsZero(), !live[j].readySince.IsZero()
			if ri != rj {
				return !ri
			}
			return live[i].started.After(live[j].started)
		})
		for _, pr := range live[:len(live)-want] {
			l.stopPod(pr, podsource.ReasonScaledDown)
		}
		l.submitStatus(p)
	}
	for n := len(live); n < want && !l.s.clk.Now().Before(p.retryAt); n++ {
		if err := l.startPod(p); err != nil {
			l.s.log.Error("cannot start pod", "runtime", p.key.String(), "err", err)
			l.failed(p, time.Time{})
		}
	}
	l.armRetry()
}

// failed counts a pod failure of p and pushes its next start back.
// readySince is when the failed pod became ready (zero if never).
func (l *loop) failed(p *pool, readySince time.Time) {
	now := l.s.clk.Now()
	if !readySince.IsZero() && now.Sub(readySince) >= backoffMax {
		p.failures = 0
	}
	p.failures++
	delay := backoffMax
	if p.failures <= 10 {
		delay = min(backoffBase<<(p.failures-1), backoffMax)
	}
	p.retryAt = now.Add(delay)
}

// armRetry sets the retry timer to the earliest end of a backoff of a pool
// that is short of pods.
func (l *loop) armRetry() {
	var next time.Time
	for _, p := range l.pools {
		if p.deleted || !p.retryAt.After(l.s.clk.Now()) {
			continue
		}
		live := 0
		for _, pr := range p.pods {
			if !pr.stopping {
				live++
			}
		}
		if live < int(p.spec.Replicas) && (next.IsZero() || p.retryAt.Before(next)) {
			next = p.retryAt
		}
	}
	l.retry.Stop()
	l.retryArmed = !next.IsZero()
	if l.retryArmed {
		l.retry.Reset(next.Sub(l.s.clk.Now()))
	}
}

// startPod creates a pod of p under a new name and UID and starts its
// goroutine.
func (l *loop) startPod(p *pool) error {
	s := l.s
	name, dir, err := s.claimPodDir(p.key.name)
	if err != nil {
		return err
	}
	info := podsource.Pod{
		Namespace:     p.key.namespace,
		Runtime:       p.key.name,
		Name:          name,
		UID:           string(uuid.NewUUID()),
		Server:        p.spec.Server,
		Lambda:        p.spec.Lambda,
		Template:      p.spec.Template,
		Slots:         p.spec.Runs,
		Addr:          "unix://" + filepath.Join(dir, socketName),
		WorkspaceRoot: s.runsDir,
	}
	pr := &podRun{info: info, pool: p, started: s.clk.Now(), stop: make(chan struct{})}
	p.pods[info.UID] = pr
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		reason := s.runPod(pr, info, dir, func() { l.reports <- podReport{p: pr, ready: true} })
		l.reports <- podReport{p: pr, reason: reason}
	}()
	l.submitStatus(p)
	return nil
}

// stopPod asks pr's goroutine to stop its pod; it reports gone with reason
// (unless the pod died on its own first).
func (l *loop) stopPod(pr *podRun, reason string) {
	if pr.stopping {
		return
	}
	pr.stopping = true
	pr.stopReason = reason
	close(pr.stop)
}

func (l *loop) handleReport(r podReport) {
	pr, p := r.p, r.p.pool
	log := l.s.log.With("runtime", p.key.String(), "pod", pr.info.Name, "pod_uid", pr.info.UID)
	if r.ready {
		if pr.stopping {
			return // never announced: it is on its way out
		}
		pr.readySince = l.s.clk.Now()
		log.Info("pod ready", "startup", pr.readySince.Sub(pr.started).Round(time.Millisecond))
		l.s.hub.Publish(podsource.Event{Type: podsource.PodReady, Pod: pr.info})
		l.submitStatus(p)
		return
	}
	delete(p.pods, pr.info.UID)
	if !pr.readySince.IsZero() {
		log.Info("pod gone", "reason", r.reason)
		l.s.hub.Publish(podsource.Event{Type: podsource.PodGone, Pod: pr.info, Reason: r.reason})
	} else {
		log.Info("pod ended before it was ready", "reason", r.reason)
	}
	if !pr.stopping {
		l.failed(p, pr.readySince)
		log.Info("replacing pod", "after", p.retryAt.Sub(l.s.clk.Now()).Round(time.Millisecond), "failures", p.failures)
	}
	if p.deleted {
		if len(p.pods) == 0 {
			delete(l.pools, p.uid)
		}
		return
	}
	l.reconcile(p)
	l.submitStatus(p)
}

// submitStatus hands p's current status to the status writer.
func (l *loop) submitStatus(p *pool) {
	if p.deleted {
		return
	}
	u := statusUpdate{uid: p.uid, pods: make([]v1alpha1.PodStatus, 0, len(p.pods))}
	for _, pr := range p.pods {
		ready := !pr.readySince.IsZero() && !pr.stopping
		if ready {
			u.ready++
		}
		ps := v1alpha1.PodStatus{Name: pr.info.Name, UID: pr.info.UID, Ready: ready, Address: pr.info.Addr}
		if hb := pr.heartbeat.Load(); hb != 0 {
			t := metav1.NewTime(time.Unix(0, hb))
			ps.LastHeartbeat = &t
		}
		u.pods = append(u.pods, ps)
	}
	sort.Slice(u.pods, func(i, j int) bool { return u.pods[i].Name < u.pods[j].Name })
	l.status.submit(p.key, u)
}
