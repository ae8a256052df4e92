package pool

import (
	"context"
	"errors"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// watch mirrors the store's Runtime objects into out until ctx ends: a full
// list (sync) first and after every broken watch, then each change. A
// failing store is retried with backoff.
func (s *Supervisor) watch(ctx context.Context, out chan<- rtMsg) {
	res := s.cfg.Store.Runtimes()
	send := func(m rtMsg) bool {
		select {
		case out <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	delay := backoffBase
	pause := func(err error, what string) bool {
		s.log.Warn("runtime watch: "+what+" failed; retrying", "err", err, "after", delay)
		t := s.clk.NewTimer(delay)
		defer t.Stop()
		delay = min(2*delay, backoffMax)
		select {
		case <-t.C():
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		items, rv, err := res.List(ctx, store.ListOptions{})
		if err != nil {
			if ctx.Err() != nil || !pause(err, "list") {
				return
			}
			continue
		}
		if !send(rtMsg{sync: true, items: items}) {
			return
		}
		w, err := res.Watch(ctx, store.WatchOptions{ResourceVersion: rv})
		if err != nil {
			if ctx.Err() != nil || !pause(err, "watch") {
				return
			}
			continue
		}
		err = s.follow(w, send)
		w.Stop()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errdefs.ErrExpired):
			// Fell behind the store's history: re-list at once.
			s.log.Info("runtime watch expired; re-listing")
			delay = backoffBase
		default:
			if err == nil {
				err = errors.New("watch ended")
			}
			if !pause(err, "watch") {
				return
			}
		}
	}
}

// follow forwards w's events until it ends and returns the error it ended
// with, if any.
func (s *Supervisor) follow(w store.Watcher[*v1alpha1.Runtime], send func(rtMsg) bool) error {
	for ev := range w.Events() {
		var ok bool
		switch ev.Type {
		case store.Added, store.Modified:
			ok = send(rtMsg{obj: ev.Object})
		case store.Deleted:
			ok = send(rtMsg{obj: ev.Object, deleted: true})
		case store.Error:
			return ev.Err
		default:
			ok = true
		}
		if !ok {
			return nil
		}
	}
	return nil
}
