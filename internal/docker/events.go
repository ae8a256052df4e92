package docker

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/events"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/store"
)

// eventLog keeps the last bounds.DockerEvents container events, numbered,
// for `docker events`: a reader with --since replays what it still holds,
// a follower reads on at its own pace. Publishing never waits for a
// reader; a reader that falls a whole log behind is ended instead (it
// would have missed events).
type eventLog struct {
	mu      sync.Mutex
	ring    []events.Message
	next    uint64        // the number of the next event
	changed chan struct{} // closed (and replaced) at each event

	// phases is what the log has said of each task Run, by UID, so that
	// a Run event says start and die once each.
	phases map[string]runSeen
}

type runSeen struct{ started, died bool }

func newEventLog() *eventLog {
	return &eventLog{changed: make(chan struct{}), phases: map[string]runSeen{}}
}

// publish appends an event and wakes the followers.
func (l *eventLog) publish(m events.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < bounds.DockerEvents {
		l.ring = append(l.ring, m)
	} else {
		l.ring[l.next%bounds.DockerEvents] = m
	}
	l.next++
	close(l.changed)
	l.changed = make(chan struct{})
}

// head is the number of the next event.
func (l *eventLog) head() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// read returns the events numbered from seq on that the log still holds,
// the number after them, the channel closed at the next event, and
// whether events after seq were already overwritten.
func (l *eventLog) read(seq uint64) ([]events.Message, uint64, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.next - uint64(len(l.ring))
	lost := seq < first
	seq = max(seq, first)
	out := make([]events.Message, 0, l.next-seq)
	for i := seq; i < l.next; i++ {
		out = append(out, l.ring[i%bounds.DockerEvents])
	}
	return out, l.next, l.changed, lost
}

// containerEvent is a container's event at now.
// exitOf is the exit code of the container's last die event still held:
// what a waiter that did not see its Run end before it was deleted (an
// AutoRemove container that ended and went between two of its looks)
// reports.
func (l *eventLog) exitOf(id string) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := l.next; i > l.next-uint64(len(l.ring)); i-- {
		m := l.ring[(i-1)%bounds.DockerEvents]
		if m.Actor.ID == id && m.Action == events.ActionDie {
			code, err := strconv.Atoi(m.Actor.Attributes["exitCode"])
			return code, err == nil
		}
	}
	return 0, false
}

func containerEvent(c *ctr, action events.Action, attrs map[string]string, now time.Time) events.Message {
	a := map[string]string{"name": c.name, "image": c.meta.Image}
	for k, v := range c.meta.Labels {
		a[k] = v
	}
	for k, v := range attrs {
		a[k] = v
	}
	return events.Message{Type: events.ContainerEventType, Action: action, Scope: "local",
		Actor: events.Actor{ID: c.id, Attributes: a}, Time: now.Unix(), TimeNano: now.UnixNano()}
}

// event publishes a container's event, now.
func (s *Server) event(c *ctr, action events.Action, attrs map[string]string) {
	s.events.publish(containerEvent(c, action, attrs, time.Now()))
}

// runEvent turns a watch event of a task Run into the container's
// events: create (a Run not made through this API), start once it runs,
// die once it ended (with its exit code), destroy when it is deleted.
func (s *Server) runEvent(ev store.Event[*v1alpha1.Run]) {
	run := ev.Object
	if run == nil || run.Spec.Mode.Task == nil {
		return
	}
	c := s.fromRun(run)
	uid := string(run.UID)
	l := s.events
	l.mu.Lock()
	seen, known := l.phases[uid]
	var actions []events.Action
	if ev.Type == store.Deleted {
		delete(l.phases, uid)
		if known && seen.started && !seen.died {
			actions = append(actions, events.ActionDie)
		}
		actions = append(actions, events.ActionDestroy)
	} else {
		if !known && run.Annotations[AnnotationID] == "" {
			actions = append(actions, events.ActionCreate)
		}
		phase := run.Status.Phase
		if !seen.started && (phase == v1alpha1.PhaseRunning || phase.Terminal()) {
			seen.started = true
			actions = append(actions, events.ActionStart)
		}
		if !seen.died && phase.Terminal() {
			seen.died = true
			actions = append(actions, events.ActionDie)
		}
		l.phases[uid] = seen
	}
	l.mu.Unlock()
	for _, a := range actions {
		var attrs map[string]string
		if a == events.ActionDie {
			code := c.exitCode()
			if ev.Type == store.Deleted && !run.Status.Phase.Terminal() {
				code = 137 // deleted while it ran: killed
			}
			attrs = map[string]string{"exitCode": strconv.Itoa(code)}
		}
		s.event(c, a, attrs)
	}
}

// eventQuery is what `docker events` asks for.
type eventQuery struct {
	since, until time.Time
	filters      filters
}

func parseEventQuery(r *http.Request) (eventQuery, error) {
	q := r.URL.Query()
	var eq eventQuery
	var err error
	if eq.since, err = parseTimestamp("since", q.Get("since")); err != nil {
		return eq, err
	}
	if eq.until, err = parseTimestamp("until", q.Get("until")); err != nil {
		return eq, err
	}
	eq.filters, err = parseFiltersOf(q.Get("filters"), "type", "event", "container", "image", "label", "scope")
	return eq, err
}

// match reports whether m passes the query's filters (any value of each).
func (eq eventQuery) match(m events.Message) bool {
	for k, vals := range eq.filters {
		ok := false
		for _, v := range vals {
			switch k {
			case "type":
				ok = ok || string(m.Type) == v
			case "scope":
				ok = ok || m.Scope == v
			case "event":
				ok = ok || string(m.Action) == v
			case "container":
				ok = ok || m.Actor.Attributes["name"] == strings.TrimPrefix(v, "/") || (len(v) >= 1 && strings.HasPrefix(m.Actor.ID, v))
			case "image":
				ok = ok || m.Actor.Attributes["image"] == NormalizeImage(v)
			case "label":
				lk, lv, hasValue := strings.Cut(v, "=")
				have, present := m.Actor.Attributes[lk]
				ok = ok || (present && (!hasValue || have == lv))
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// systemEvents streams the container events (GET /events): those the
// log still holds from since on, then, unless until has passed, the new
// ones as they come until until, one JSON object a line.
func (s *Server) systemEvents(w http.ResponseWriter, r *http.Request) {
	eq, err := parseEventQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	ctx := r.Context()
	if !eq.until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, eq.until)
		defer cancel()
	}
	// Without since, only what comes from now on; with it, what the log
	// still holds first.
	seq, replay := s.events.head(), !eq.since.IsZero()
	if replay {
		seq = 0
	}
	for {
		msgs, next, changed, lost := s.events.read(seq)
		if lost && !replay {
			s.log.Info("docker: an events reader fell behind the log; ending its stream", "behind", bounds.DockerEvents)
			return
		}
		for _, m := range msgs {
			t := time.Unix(0, m.TimeNano)
			if !eq.until.IsZero() && t.After(eq.until) {
				return
			}
			if (!eq.since.IsZero() && t.Before(eq.since)) || !eq.match(m) {
				continue
			}
			writeJSONLine(w, m)
		}
		seq, replay = next, false
		if !eq.until.IsZero() && !time.Now().Before(eq.until) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}
