package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// outBuffer is the capacity of a watcher's channel. The rest of the
// backlog of a slow receiver waits in the API server's buffer for the
// watch (and the connection's); when that fills, the API server ends the
// watch and the watcher resumes from the last event it delivered.
const outBuffer = 64

// A watch that the API server ended without delivering anything, bookmarks
// included, is resumed after a pause, doubling from minResumePause to
// maxResumePause while that repeats, so that a server or proxy that ends
// every watch at once is not hammered.
const (
	minResumePause = 100 * time.Millisecond
	maxResumePause = 5 * time.Second
)

// watcher is one watch: a goroutine that reads the API watch, resumes it
// when the API server ends it, and forwards the events.
type watcher[T store.Object] struct {
	r         *resource[T]
	ctx       context.Context
	cancel    context.CancelFunc
	namespace string
	selector  string
	rv        string // the last version seen, an event's or a bookmark's

	out      chan store.Event[T]
	stopOnce sync.Once
	exited   chan struct{}
}

// Watch implements store.Resource.
func (r *resource[T]) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher[T], error) {
	if err := r.s.check(); err != nil {
		return nil, err
	}
	var phases []v1alpha1.Phase
	if opts.Phase != "" {
		phases = []v1alpha1.Phase{opts.Phase} // one phase: exact, no filter here
	}
	sel, _, err := r.fieldSelector(phases, opts.AssignedPodUID, opts.PlacedPodUID)
	if err != nil {
		return nil, err
	}
	if v := opts.ResourceVersion; v != "" {
		// Opaque to clients, but the API server parses it as an etcd
		// revision and answers one that does not parse with a 500.
		if _, err := strconv.ParseUint(v, 10, 64); err != nil {
			return nil, fmt.Errorf("watch %ss: resourceVersion %q is not a version: %w", r.k.noun, v, errdefs.ErrInvalidArgument)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(r.s.ctx, cancel)
	w := &watcher[T]{
		r:         r,
		ctx:       wctx,
		cancel:    func() { stopOnClose(); cancel() },
		namespace: opts.Namespace,
		selector:  sel,
		rv:        opts.ResourceVersion,
		out:       make(chan store.Event[T], outBuffer),
		exited:    make(chan struct{}),
	}
	if w.rv == "" || w.rv == "0" {
		// From now: a Kubernetes watch from "" or "0" would first replay
		// every object as ADDED.
		if w.rv, err = r.currentVersion(wctx, opts.Namespace, sel); err != nil {
			w.cancel()
			return nil, err
		}
	}
	stream, err := r.openWatch(wctx, w.rv, opts.Namespace, sel)
	if err != nil {
		w.cancel()
		return nil, err
	}
	if err := r.s.addWatch(); err != nil {
		stream.close()
		w.cancel()
		return nil, err
	}
	go w.run(stream)
	return w, nil
}

// currentVersion is the API server's current resourceVersion, from a list
// of at most one object (with the watch's own namespace and selector, which
// is what the caller may be allowed to list).
func (r *resource[T]) currentVersion(ctx context.Context, namespace, selector string) (string, error) {
	req := r.rc.Get().Resource(r.k.resource).Param("limit", "1")
	if namespace != "" {
		req = req.Namespace(namespace)
	}
	if selector != "" {
		req = req.Param("fieldSelector", selector)
	}
	list := &metav1.PartialObjectMetadataList{}
	if err := req.Do(ctx).Into(list); err != nil {
		return "", r.failWatch(namespace, err)
	}
	return list.ResourceVersion, nil
}

// openWatch starts an API watch after version rv, with bookmarks, which
// keep the version to resume from recent while no event matches. Its
// events are read and decoded on the caller's goroutine (eventReader).
func (r *resource[T]) openWatch(ctx context.Context, rv, namespace, selector string) (*eventReader[T], error) {
	req := r.rc.Get().Resource(r.k.resource).
		Param("watch", "true").
		Param("allowWatchBookmarks", "true").
		Param("resourceVersion", rv)
	if namespace != "" {
		req = req.Namespace(namespace)
	}
	if selector != "" {
		req = req.Param("fieldSelector", selector)
	}
	if r.s.watchTimeout > 0 {
		req = req.Param("timeoutSeconds", strconv.FormatInt(r.s.watchTimeout, 10))
	}
	body, err := req.Stream(ctx)
	if err != nil {
		return nil, r.failWatch(namespace, err)
	}
	return newEventReader[T](body), nil
}

// failWatch is failList for watches.
func (r *resource[T]) failWatch(namespace string, err error) error {
	return fmt.Errorf("watch: %w", r.failList(namespace, err))
}

// Events implements store.Watcher.
func (w *watcher[T]) Events() <-chan store.Event[T] { return w.out }

// Stop implements store.Watcher.
func (w *watcher[T]) Stop() {
	w.stopOnce.Do(w.cancel)
	<-w.exited
}

// run forwards the API watch's events until the watch ends, resuming it
// from the last version seen each time the API server ends it.
func (w *watcher[T]) run(stream *eventReader[T]) {
	defer func() {
		close(w.out)
		close(w.exited)
		w.r.s.watches.Done()
	}()
	pause := time.Duration(0)
	for {
		progressed, err := w.pump(stream)
		stream.close()
		if w.ctx.Err() != nil {
			return
		}
		if err != nil {
			w.send(store.Event[T]{Type: store.Error, Err: err})
			return
		}
		if progressed {
			pause = 0
		} else {
			pause = min(max(2*pause, minResumePause), maxResumePause)
			if !w.wait(pause) {
				return
			}
		}
		w.r.s.log.Debug("kube store: the API server ended a watch, resuming", "kind", w.r.k.name, "namespace", w.namespace, "resource_version", w.rv)
		if stream, err = w.r.openWatch(w.ctx, w.rv, w.namespace, w.selector); err != nil {
			if w.ctx.Err() == nil {
				w.send(store.Event[T]{Type: store.Error, Err: err})
			}
			return
		}
	}
}

// pump forwards one API watch's events until it ends. It reports whether
// the watch delivered anything, and the error that ends the whole watch
// (nil when the API server just closed the stream, the connection broke,
// or the watch was stopped).
func (w *watcher[T]) pump(stream *eventReader[T]) (progressed bool, err error) {
	for {
		typ, obj, err := stream.read(w.r.k.new)
		var status apierrors.APIStatus
		switch {
		case w.ctx.Err() != nil, errors.Is(err, errStreamEnded):
			return progressed, nil
		case errors.As(err, &status):
			return progressed, w.r.failWatch(w.namespace, err)
		case err != nil:
			return progressed, fmt.Errorf("watch %ss: %w", w.r.k.noun, err)
		}
		switch typ {
		case watch.Bookmark:
			w.rv = obj.GetResourceVersion()
			progressed = true
		case watch.Added, watch.Modified, watch.Deleted:
			w.rv = obj.GetResourceVersion()
			progressed = true
			if !w.send(store.Event[T]{Type: store.EventType(typ), Object: w.r.clean(obj)}) {
				return progressed, nil
			}
		default:
			return progressed, fmt.Errorf("watch %ss: unexpected event type %q: %w", w.r.k.noun, typ, errdefs.ErrInternal)
		}
	}
}

// wait pauses for d unless the watch ends first.
func (w *watcher[T]) wait(d time.Duration) bool {
	t := w.r.s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-w.ctx.Done():
		return false
	}
}

// send delivers ev unless the watch ends first.
func (w *watcher[T]) send(ev store.Event[T]) bool {
	select {
	case w.out <- ev:
		return true
	case <-w.ctx.Done():
		return false
	}
}
