package scheduler

import (
	"context"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
)

// placedWait is how long a Run placed at its create is left to its pod's
// runtimed, which writes the assignment with its claim, before the
// scheduler writes the assignment itself (the runtimed did not take it:
// it is restarting, or its watch is behind).
const placedWait = time.Second

// ticket is a slot Place reserved for a Run not created yet.
type ticket struct {
	pod string // UID
	at  time.Time
}

// placeReq is a call of Place (or of Unplace, cancel set) waiting for the
// loop.
type placeReq struct {
	key     informer.Key
	runtime string
	cancel  bool
	reply   chan string // buffered; the pod's UID, "" when not placed
}

// Place reserves a slot for a Run its caller is about to create, named
// namespace/name, of Runtime runtime: the least-loaded ready pod with a
// free slot, as the Run would get once created, unless Runs already wait
// for the pool (they go first). The caller creates the Run placed on
// that pod (placement.Place) and tells Created of it, or calls Unplace
// when the create failed; a reservation no Run takes lapses after 10 s.
// The pod's runtimed may then take the Run as created, writing its
// assignment with its claim: the Scheduled write is not on the way to the
// Run's start. It returns the pod's UID, or false when nothing was
// reserved (create the Run unplaced). It waits for the scheduler's loop,
// at most until ctx ends.
func (s *Scheduler) Place(ctx context.Context, namespace, name, runtime string) (podUID string, ok bool) {
	if !s.serving.Load() {
		return "", false
	}
	r := placeReq{key: informer.Key{Namespace: namespace, Name: name}, runtime: runtime, reply: make(chan string, 1)}
	s.request(r)
	select {
	case podUID = <-r.reply:
		return podUID, podUID != ""
	case <-ctx.Done():
	case <-s.done:
	}
	s.Unplace(namespace, name)
	return "", false
}

// Unplace gives back the slot Place reserved for namespace/name. It never
// blocks.
func (s *Scheduler) Unplace(namespace, name string) {
	s.request(placeReq{key: informer.Key{Namespace: namespace, Name: name}, cancel: true})
}

func (s *Scheduler) request(r placeReq) {
	s.placeMu.Lock()
	s.placeReqs = append(s.placeReqs, r)
	s.placeMu.Unlock()
	s.loop.Add(loopKey{kind: keyPlace})
}

// servePlaces answers the waiting Place and Unplace calls, in order.
func (s *Scheduler) servePlaces() {
	s.placeMu.Lock()
	reqs := s.placeReqs
	s.placeReqs = nil
	s.placeMu.Unlock()
	for _, r := range reqs {
		s.dropTicket(r.key)
		if r.cancel {
			continue
		}
		r.reply <- s.place(r)
	}
}

// place reserves a slot for r and returns its pod's UID, or "".
func (s *Scheduler) place(r placeReq) string {
	p := s.pools[informer.Key{Namespace: r.key.Namespace, Name: r.runtime}]
	if p == nil || p.waiting.Len() > 0 {
		return ""
	}
	ps := s.pick(p)
	if ps == nil {
		return ""
	}
	now := s.clk.Now()
	s.used[ps.pod.UID]++
	s.tickets[r.key] = ticket{pod: ps.pod.UID, at: now}
	p.handedAt = now
	s.loop.After(now.Add(hintTTL), loopKey{keyTicket, r.key})
	return ps.pod.UID
}

// dropTicket gives back the slot of the reservation for k, if any.
func (s *Scheduler) dropTicket(k informer.Key) {
	t, ok := s.tickets[k]
	if !ok {
		return
	}
	delete(s.tickets, k)
	if s.used[t.pod]--; s.used[t.pod] <= 0 {
		delete(s.used, t.pod)
	}
	if ps := s.pods[t.pod]; ps != nil {
		s.dirty[podPool(ps.pod)] = struct{}{}
	}
}

// lapseTicket drops the reservation for k once it is hintTTL old: no Run
// of its name came to take it.
func (s *Scheduler) lapseTicket(k informer.Key) {
	if t, ok := s.tickets[k]; ok && !s.clk.Now().Before(t.at.Add(hintTTL)) {
		s.dropTicket(k)
	}
}

// decidePlaced handles a Run placed at its create that nothing has
// written yet (placement.Unclaimed): it holds a slot of its pod, taken
// from its creator's reservation or, without one, from the pod's free
// slots, while its runtimed takes it; past placedWait the scheduler
// writes the assignment itself. A Run whose pod is gone, or full without
// a reservation, is decided as any Run pinned there.
func (s *Scheduler) decidePlaced(ctx context.Context, rs *runState, run *v1alpha1.Run, p *poolState) {
	ps := s.pods[rs.pin]
	if ps == nil || podPool(ps.pod) != rs.pool {
		s.dropTicket(rs.key)
		rs.placedAt = time.Time{}
		s.decidePinned(ctx, rs, run, p)
		return
	}
	now := s.clk.Now()
	if rs.reserved != rs.pin {
		t, ticketed := s.tickets[rs.key]
		s.dropTicket(rs.key)
		if (!ticketed || t.pod != rs.pin) && s.used[rs.pin] >= int(ps.pod.Slots) {
			rs.placedAt = time.Time{}
			s.decidePinned(ctx, rs, run, p)
			return
		}
		s.unwait(rs)
		rs.reserved, rs.reservedBase = rs.pin, run.ResourceVersion
		s.setSlot(rs, rs.pin)
		if rs.placedAt.IsZero() {
			rs.placedAt = now
		}
		p.handedAt = now
	}
	if at := rs.placedAt.Add(placedWait); now.Before(at) {
		s.after(rs, at)
		return
	}
	s.write(ctx, rs, run, job{kind: jobAssign, pod: ps.pod})
}

// placedGone decides again the Runs placed at their create on a pod that
// went, and drops the reservations made on it.
func (s *Scheduler) placedGone(ctx context.Context, podUID string) {
	for k, t := range s.tickets {
		if t.pod == podUID {
			s.dropTicket(k)
		}
	}
	var placed []informer.Key
	for k, rs := range s.runs {
		if !rs.placedAt.IsZero() && rs.pin == podUID {
			placed = append(placed, k)
		}
	}
	for _, k := range placed {
		s.sync(ctx, k)
	}
}
