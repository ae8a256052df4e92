package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
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
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/store"
)

// Defaults for Config.
const (
	DefaultHealthInterval = time.Second
	DefaultCheckTimeout   = time.Second
	DefaultUnhealthyAfter = 3
	DefaultStartTimeout   = 30 * time.Second
	DefaultShutdownGrace  = 5 * time.Second
	DefaultStatusInterval = 10 * time.Second
)

// Replacement backoff: after a pod of a pool fails (exits, turns unhealthy
// or never becomes ready) the next start of that pool waits backoffBase,
// doubling per failure in a row up to backoffMax. A pod that was ready for
// backoffMax before it failed starts the count afresh.
const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 10 * time.Second
)

// killSlack is how long past its --shutdown-grace a Runtime Server that was
// sent SIGTERM may take before it is killed.
const killSlack = 5 * time.Second

// socketName is the Runtime Server's socket inside its pod directory.
const socketName = "rs.sock"

// DebugSocketName is the Runtime Server's debug socket (its
// --debug-socket, internal/debugsock) inside its pod directory, which is
// 0700: <DataDir>/pods/<pod name>/debug.sock.
const DebugSocketName = "debug.sock"

// maxSocketPath is the longest Unix socket path the kernel accepts
// (sockaddr_un.sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// Config configures a Supervisor.
type Config struct {
	// Store holds the Runtime objects the supervisor follows and whose
	// status it writes. Required.
	Store store.Store
	// DataDir is where pods live: <DataDir>/pods/<name>/ holds a pod's
	// sockets and records (the supervisor owns <DataDir>/pods and clears
	// it on start, after killing what is left of the pods an earlier
	// supervisor recorded there), <DataDir>/scratch/<name> is its
	// Runtime Server's --state-dir (cleared on start too), and
	// <DataDir>/runs is the one workspace root shared by all pods, which
	// runtimed fills with a directory per Run. Required.
	DataDir string
	// Command builds the command for a pod's Runtime Server; args start
	// with "runtime-server". The default runs this executable with args.
	// The supervisor starts it with proc.Start, in a session of its own,
	// and sets its stdout and stderr (when nil) to a pipe that it logs
	// line by line.
	Command func(pod podsource.Pod, args []string) *exec.Cmd
	// Logger receives the supervisor's logs and the pods' own logs (their
	// events; the Runs' output goes to RunLogDir). Nil discards them.
	Logger *slog.Logger
	// RunLogDir is the pods' --run-log-dir, where each Runtime Server
	// writes the Runs' output (internal/runlog). Empty leaves it to the
	// Runtime Server: inside the pod's directory, removed with the pod.
	RunLogDir string
	// HealthInterval is the time between two health checks of a pod.
	HealthInterval time.Duration
	// CheckTimeout bounds one health check.
	CheckTimeout time.Duration
	// UnhealthyAfter is how many failed health checks in a row fence a pod.
	UnhealthyAfter int
	// StartTimeout bounds the time from starting a Runtime Server until it
	// answers its health check; a pod that takes longer is killed and
	// replaced.
	StartTimeout time.Duration
	// ShutdownGrace is the Runtime Server's --shutdown-grace: how long
	// work in flight may finish after SIGTERM. The supervisor kills a pod
	// that has not exited ShutdownGrace+5s after SIGTERM.
	ShutdownGrace time.Duration
	// StatusInterval is how often status.pods[].lastHeartbeat is refreshed
	// in the store; readiness changes are written at once.
	StatusInterval time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// DebugSockets gives each pod's Runtime Server a debug socket
	// (DebugSocketName in its pod directory) serving Go's profiles.
	DebugSockets bool
	// Cgroup, when set, is the cgroup v2 this supervisor owns for its pods:
	// each pod starts directly in a child group of it (recorded in the
	// pod's directory first), which is killed with cgroup.kill and removed
	// when the pod ends, and the pod's Runtime Server puts each task in a
	// child of that (--containment auto). Nil: pods run in this process's
	// cgroup with --containment subreaper.
	Cgroup *cgroup.Group
	// RunAs, when set, is the unprivileged user the pods' Runs run as
	// (their Runtime Servers' --run-as-user; this process is root). The
	// workspace root <DataDir>/runs and the pods' scratch directories
	// <DataDir>/scratch/<pod name> are then passages it can go through
	// but not list (internal/runuser); <DataDir>/pods, with the pods'
	// sockets, stays private.
	RunAs *runuser.User
}

// Supervisor keeps the runtime pods of every Runtime object running. Create
// it with NewSupervisor and drive it with Run; Subscribe, Pods and Lookup
// may be called from any goroutine, before, during and after Run.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	clk     clock.WithTicker
	podsDir string
	runsDir string
	// scratchDir holds each pod's --state-dir: its Runs' scratch
	// directories, apart from the pod's directory and its sockets.
	scratchDir string
	running    atomic.Bool

	hub *podsource.Hub
}

// NewSupervisor checks cfg, fills in its defaults and returns a Supervisor
// that does nothing until Run.
func NewSupervisor(cfg Config) (*Supervisor, error) {
	if cfg.Store == nil {
		return nil, errors.New("pool: a store is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("pool: a data directory is required")
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pool: data directory: %w", err)
	}
	cfg.DataDir = dataDir
	if cfg.Command == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("pool: find the stoke executable: %w", err)
		}
		cfg.Command = func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(exe, args...) }
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	setDefault(&cfg.HealthInterval, DefaultHealthInterval)
	setDefault(&cfg.CheckTimeout, DefaultCheckTimeout)
	setDefault(&cfg.StartTimeout, DefaultStartTimeout)
	setDefault(&cfg.ShutdownGrace, DefaultShutdownGrace)
	setDefault(&cfg.StatusInterval, DefaultStatusInterval)
	if cfg.UnhealthyAfter <= 0 {
		cfg.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Supervisor{
		cfg:        cfg,
		log:        cfg.Logger,
		clk:        cfg.Clock,
		podsDir:    filepath.Join(dataDir, "pods"),
		runsDir:    filepath.Join(dataDir, "runs"),
		scratchDir: filepath.Join(dataDir, "scratch"),
		hub:        podsource.NewHub(cfg.Logger),
	}, nil
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Subscribe is podsource.Hub's Subscribe: the ready pods and their later
// transitions. After Run has returned the channel is closed once the
// subscriber has received every queued event.
func (s *Supervisor) Subscribe() (events <-chan podsource.Event, snapshot []podsource.Pod, cancel func()) {
	return s.hub.Subscribe()
}

// Pods returns the pods announced ready and not yet gone, sorted by name
// (a pod being stopped stays until its PodGone).
func (s *Supervisor) Pods() []podsource.Pod { return s.hub.Pods() }

// Lookup returns the pod with this UID if it was announced ready and is
// not yet gone.
func (s *Supervisor) Lookup(uid string) (podsource.Pod, bool) { return s.hub.Lookup(uid) }

// Run follows the Runtime objects in the store and keeps spec.replicas pods
// running for each until ctx ends. Then it stops every pod (SIGTERM, then
// SIGKILL after ShutdownGrace+5s), announces each as gone with reason
// Shutdown, writes the final status, and returns once every child process
// has been reaped and every goroutine it started has ended. It returns nil
// after a shutdown, or an error when it cannot start at all. Run may be
// called once.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("pool: Run called twice")
	}
	defer s.hub.End()
	if err := os.MkdirAll(s.runsDir, 0o700); err != nil {
		return fmt.Errorf("pool: workspace root: %w", err)
	}
	if err := s.cfg.RunAs.Passage(s.runsDir); err != nil {
		return fmt.Errorf("pool: workspace root: %w", err)
	}
	// Pod directories left by an earlier supervisor belong to pods that
	// died with it: their Runtime Servers got a parent-death signal and
	// drained. What they could not reach is killed here.
	s.killLeftovers()
	if err := os.RemoveAll(s.podsDir); err != nil {
		return fmt.Errorf("pool: clear pods directory: %w", err)
	}
	if err := os.MkdirAll(s.podsDir, 0o700); err != nil {
		return fmt.Errorf("pool: pods directory: %w", err)
	}
	// The earlier pods' scratch directories went with their Runs.
	if err := os.RemoveAll(s.scratchDir); err != nil {
		return fmt.Errorf("pool: clear scratch directory: %w", err)
	}
	if err := s.cfg.RunAs.Passage(s.scratchDir); err != nil {
		return fmt.Errorf("pool: scratch directory: %w", err)
	}
	l := &loop{
		s:       s,
		pools:   make(map[types.UID]*pool),
		current: make(map[rtKey]*pool),
		reports: make(chan podReport),
		status:  newStatusWriter(s.cfg.Store.Runtimes(), s.log, s.clk),
		retry:   s.clk.NewTimer(time.Hour),
	}
	l.retry.Stop()
	return l.run(ctx)
}

// killLeftovers kills what is left of the sessions of the pods that an
// earlier supervisor on this data directory recorded (its sidFile) and
// did not stop: processes in process groups their Runtime Server did not
// know of (job control), or everything, if the server died before it
// could drain. A record whose leader's pid now belongs to another process
// is skipped (proc.Session.Kill).
func (s *Supervisor) killLeftovers() {
	entries, err := os.ReadDir(s.podsDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot list the pods of an earlier supervisor", "err", err)
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		log := s.log.With("pod", e.Name())
		if err := removeRecordedIPC(filepath.Join(s.podsDir, e.Name())); err != nil {
			log.Warn("cannot remove the IPC directory of an earlier pod", "err", err)
		}
		s.removeRecordedCgroup(filepath.Join(s.podsDir, e.Name()), log)
		b, err := os.ReadFile(filepath.Join(s.podsDir, e.Name(), sidFile))
		if errors.Is(err, fs.ErrNotExist) {
			continue // it died before it was recorded, taking nothing along
		}
		if err != nil {
			log.Warn("cannot read the session of an earlier pod", "err", err)
			continue
		}
		sess, err := proc.ParseSession(string(b))
		if err != nil {
			log.Warn("cannot read the session of an earlier pod", "err", err)
			continue
		}
		killed, err := sess.Kill(fenceWait)
		if len(killed) > 0 {
			log.Warn("killed processes left by an earlier pod", "session", sess.ID, "pids", killed)
		}
		if err != nil {
			log.Error("cannot kill what is left of an earlier pod", "session", sess.ID, "err", err)
		}
	}
}

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

// claimPodDir picks a free pod name for runtime and creates its directory.
func (s *Supervisor) claimPodDir(runtime string) (name, dir string, err error) {
	for range 10 {
		name = runtime + "-" + randomSuffix()
		dir = filepath.Join(s.podsDir, name)
		// The longer of the pod's two socket names.
		if sock := filepath.Join(dir, DebugSocketName); len(sock) > maxSocketPath {
			return "", "", fmt.Errorf("socket path %s is longer than %d bytes: use a shorter data directory", sock, maxSocketPath)
		}
		err = os.Mkdir(dir, 0o700)
		if err == nil {
			return name, dir, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", "", fmt.Errorf("pod directory: %w", err)
		}
	}
	return "", "", fmt.Errorf("no free pod name for %s", runtime)
}

// randomSuffix is 5 random lowercase letters and digits, like a
// Kubernetes generateName suffix.
func randomSuffix() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
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
