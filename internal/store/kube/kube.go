// Package kube is the Run store of Kubernetes mode: the store.Store
// interface over the Kubernetes API, with Run and Runtime as the custom
// resources of stoke.dev/v1alpha1 (deploy/crds). It passes the same
// conformance suite (internal/store/storetest) as the SQLite store, against
// a real kube-apiserver and etcd.
//
// Every call is one API request through one REST client (JSON: the API
// server has no protobuf encoding for custom resources), so the store adds
// no state of its own: a conflict is the API server's 409, a watch is an
// API watch, and what the store promises is what the API server does.
// Where the store.Store contract and Kubernetes differ in form, the store
// translates:
//
//   - Update writes the object with PUT; the API server keeps the stored
//     status (the CRDs have a status subresource). UpdateStatus is PUT on
//     the status subresource, which keeps spec and metadata.
//   - Delete sends its preconditions (uid, resourceVersion) to the API
//     server.
//   - List's phase filter is a field selector on status.phase (a
//     selectableField of the Run CRD). Field selectors have no "in": one
//     phase is "status.phase=P", several are the "!=" terms of every known
//     phase not asked for, so that the list stays one listing at one
//     resourceVersion, served by the API server's cache; a phase the store
//     does not know is filtered out on this side.
//   - The assigned-pod filter is the field selector status.assignedPodUID,
//     for List and Watch alike.
//   - List reads in pages of at most bounds.KubeListPage objects (limit
//     and continue), all at the first page's resourceVersion, which it
//     returns. A continue token the API server no longer honours (410:
//     etcd compacted past the list's version) ends the List with an
//     error wrapping errdefs.ErrExpired; the caller lists again.
//   - A watch "from now" ("" or "0") first lists one object to learn the
//     current resourceVersion and watches from there: a Kubernetes watch
//     from "" would start with a synthetic ADDED event for every object.
//   - A watch asks for bookmarks and, when the API server ends it (its
//     request timeout, a watcher it dropped for being slow), starts again
//     from the last version it saw, so that the consumer sees one gap-free
//     stream; when that version is gone (410) the watch ends with an error
//     wrapping errdefs.ErrExpired, as the contract says.
//   - Returned objects carry apiVersion and kind and no managedFields
//     (server-side apply bookkeeping that nothing in Stoke reads; an
//     Update without them keeps the stored ones).
//
// API errors become errdefs categories (409 Conflict → ErrConflict, 409
// AlreadyExists → ErrAlreadyExists, 404 → ErrNotFound, 410 → ErrExpired,
// 400 and 422 → ErrInvalidArgument, 413 → ErrTooLarge, 401 and 403 →
// ErrUnauthenticated and ErrPermissionDenied, 429, 503, 504, a 404 for a
// path the API server does not serve and transport failures such as a
// refused connection → ErrUnavailable) and name the object as
// "<kind> <namespace>/<name>".
package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/store"
)

// Client-side rate limits of the store's one client. client-go's defaults
// (5 requests/s, bursts of 10) would cap the control plane far below what
// it must sustain: every task Run costs a create and a few status writes,
// and a thousand Runs at 100 Runs/s are several hundred requests a second.
// The API server's own flow control (API Priority and Fairness) remains
// the real limit.
const (
	DefaultQPS   = 500
	DefaultBurst = 1000
)

// DefaultFieldManager is the field manager of every Stoke writer: the
// scheduler's and runtimed's status writes then share one managedFields
// entry, which the API server rewrites in place, instead of one entry
// per component, stored, sent to every watcher and merged on every write.
const DefaultFieldManager = "stoke"

// Options configures New. The zero value uses DefaultQPS and DefaultBurst.
type Options struct {
	// QPS and Burst are the client-side rate limit of the store's requests
	// (watches are not rate limited). Zero means DefaultQPS and
	// DefaultBurst; a negative QPS disables the limit.
	QPS   float32
	Burst int
	// UserAgent names the store's requests in the API server's logs and
	// metrics; empty means client-go's default.
	UserAgent string
	// FieldManager names the store's writes in the objects'
	// managedFields; empty means DefaultFieldManager.
	FieldManager string
	// WatchTimeout asks the API server to end each watch request after
	// this long (timeoutSeconds, whole seconds); the store resumes the
	// watch from the last version it saw, so its consumer sees no break.
	// Zero leaves it to the API server (its --min-request-timeout, 30 to
	// 60 minutes).
	WatchTimeout time.Duration
	// ListPage is how many objects one List request asks for (limit);
	// zero or more than bounds.KubeListPage means bounds.KubeListPage.
	ListPage int
	// Logger receives the watches' reconnections; nil discards them.
	Logger *slog.Logger
	// Clock times the pause before resuming a watch that the API server
	// ended without delivering anything; nil means the real clock.
	Clock clock.Clock
}

// Store is a store.Store over the Kubernetes API. It is safe for
// concurrent use.
type Store struct {
	runs         *resource[*v1alpha1.Run]
	runtimes     *resource[*v1alpha1.Runtime]
	functions    *resource[*v1alpha1.Function]
	workflowRuns *resource[*v1alpha1.WorkflowRun]
	workflows    *resource[*v1alpha1.Workflow]
	httpc        *http.Client
	log          *slog.Logger
	clock        clock.Clock
	fieldManager string
	// watchTimeout is Options.WatchTimeout in whole seconds, 0 for none.
	watchTimeout int64
	// listPage is a List request's limit.
	listPage int64

	// ctx ends every watch when the store closes.
	ctx       context.Context
	cancel    context.CancelFunc
	closed    atomic.Bool
	closeOnce sync.Once
	// mu orders adding a watch against Close's wait for them.
	mu      sync.Mutex
	watches sync.WaitGroup
}

var _ store.Store = (*Store)(nil)

// New returns a store that talks to the API server cfg points at, with
// one HTTP client (one HTTP/2 connection) for all its requests. The
// Run and Runtime CRDs must be installed.
func New(cfg *rest.Config, opts Options) (store.Store, error) {
	return Open(cfg, opts)
}

// Open is New returning the concrete type.
func Open(cfg *rest.Config, opts Options) (*Store, error) {
	if cfg == nil {
		return nil, fmt.Errorf("kube store: no rest.Config: %w", errdefs.ErrInvalidArgument)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kube store: scheme: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/apis"
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	c.QPS, c.Burst = DefaultQPS, DefaultBurst
	if opts.QPS != 0 {
		c.QPS = opts.QPS
	}
	if opts.Burst != 0 {
		c.Burst = opts.Burst
	}
	if opts.UserAgent != "" {
		c.UserAgent = opts.UserAgent
	}
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kube store: http client: %w", err)
	}
	rc, err := rest.RESTClientForConfigAndClient(c, httpc)
	if err != nil {
		return nil, fmt.Errorf("kube store: rest client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{httpc: httpc, log: logging.OrDiscard(opts.Logger), clock: opts.Clock, ctx: ctx, cancel: cancel,
		fieldManager: cmp.Or(opts.FieldManager, DefaultFieldManager)}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	s.listPage = bounds.KubeListPage
	if opts.ListPage > 0 && opts.ListPage < bounds.KubeListPage {
		s.listPage = int64(opts.ListPage)
	}
	if opts.WatchTimeout > 0 {
		s.watchTimeout = max(int64(opts.WatchTimeout/time.Second), 1)
	}
	s.runs = &resource[*v1alpha1.Run]{s: s, rc: rc, k: runKind}
	s.runtimes = &resource[*v1alpha1.Runtime]{s: s, rc: rc, k: runtimeKind}
	s.functions = &resource[*v1alpha1.Function]{s: s, rc: rc, k: functionKind}
	s.workflowRuns = &resource[*v1alpha1.WorkflowRun]{s: s, rc: rc, k: workflowRunKind}
	s.workflows = &resource[*v1alpha1.Workflow]{s: s, rc: rc, k: workflowKind}
	return s, nil
}

// Runs implements store.Store.
func (s *Store) Runs() store.Resource[*v1alpha1.Run] { return s.runs }

// Runtimes implements store.Store.
func (s *Store) Runtimes() store.Resource[*v1alpha1.Runtime] { return s.runtimes }

// Functions implements store.Store.
func (s *Store) Functions() store.Resource[*v1alpha1.Function] { return s.functions }

// WorkflowRuns implements store.Store.
func (s *Store) WorkflowRuns() store.Resource[*v1alpha1.WorkflowRun] { return s.workflowRuns }

// Workflows implements store.Store.
func (s *Store) Workflows() store.Resource[*v1alpha1.Workflow] { return s.workflows }

// Close implements store.Store: it ends every watch, waits for their
// goroutines, and drops idle connections. Later calls fail with
// errdefs.ErrUnavailable.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed.Store(true)
		s.mu.Unlock()
		s.cancel()
		s.watches.Wait()
		s.httpc.CloseIdleConnections()
	})
	return nil
}

func errClosed() error {
	return fmt.Errorf("kube store is closed: %w", errdefs.ErrUnavailable)
}

// check fails a call on a closed store.
func (s *Store) check() error {
	if s.closed.Load() {
		return errClosed()
	}
	return nil
}

// addWatch counts a new watch's goroutine, unless the store is closed.
func (s *Store) addWatch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return errClosed()
	}
	s.watches.Add(1)
	return nil
}

// isClosed reports whether err came from a call the store's closing cut.
func (s *Store) isClosed(err error) bool {
	return s.closed.Load() && errors.Is(err, context.Canceled)
}
