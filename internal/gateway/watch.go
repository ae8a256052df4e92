package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// watchEvent is one line of a watch stream.
type watchEvent struct {
	Type   store.EventType `json:"type"`
	Object any             `json:"object"`
}

// watch streams changes as JSON lines. Without ?resourceVersion it first
// lists, sending each object as ADDED, and watches from the list's
// version, so that a client sees every object exactly once and then every
// change.
func watch[T store.Object](g *Gateway, w http.ResponseWriter, r *http.Request, lq listQuery,
	listFn func(ctx context.Context, opts store.ListOptions) ([]T, string, error),
	watchFn func(ctx context.Context, opts store.WatchOptions) (store.Watcher[T], error)) {
	release, ok := g.openStream(w)
	if !ok {
		return
	}
	defer release()
	ctx := r.Context()
	opts, rv := lq.opts, lq.resourceVersion
	var initial []T
	if rv == "" {
		items, listRV, err := listFn(ctx, opts)
		if err != nil {
			g.reply(w, r, 0, nil, err)
			return
		}
		initial, rv = items, listRV
	}
	wt, err := watchFn(ctx, store.WatchOptions{ResourceVersion: rv, Namespace: opts.Namespace})
	if err != nil {
		g.reply(w, r, 0, nil, err)
		return
	}
	defer wt.Stop()
	g.log.Debug("api watch", "path", r.URL.Path, "resource_version", rv)

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev watchEvent) bool {
		g.nextWrite(rc)
		if enc.Encode(ev) != nil {
			return false
		}
		return rc.Flush() == nil
	}
	for _, obj := range initial {
		if !send(watchEvent{Type: store.Added, Object: obj}) {
			return
		}
	}
	g.nextWrite(rc)
	if len(initial) == 0 && rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			// The server is stopping (or the client has gone, and this
			// write fails unseen): say so, as a watch that ends for any
			// other reason does, so that a client re-lists rather than
			// taking the end of the stream for the end of the changes.
			send(watchEvent{Type: store.Error, Object: errorBodyOf(errdefs.Errorf(errdefs.ErrUnavailable, "the server is stopping; re-list and watch again"), "")})
			return
		case ev, ok := <-wt.Events():
			if !ok {
				send(watchEvent{Type: store.Error, Object: errorBodyOf(errdefs.Errorf(errdefs.ErrUnavailable, "the watch ended; re-list and watch again"), "")})
				return
			}
			if ev.Type == store.Error {
				send(watchEvent{Type: store.Error, Object: errorBodyOf(ev.Err, "")})
				return
			}
			if !matches(ev.Object, opts) {
				continue
			}
			if !send(watchEvent{Type: ev.Type, Object: ev.Object}) {
				return
			}
		}
	}
}

// matches applies a list's label selector and phases to a watched object.
func matches[T store.Object](obj T, opts store.ListOptions) bool {
	if opts.LabelSelector != nil && !opts.LabelSelector.Matches(labels.Set(obj.GetLabels())) {
		return false
	}
	if len(opts.Phases) == 0 {
		return true
	}
	run, ok := any(obj).(*v1alpha1.Run)
	return ok && slices.Contains(opts.Phases, run.Status.Phase)
}
