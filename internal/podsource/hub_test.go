package podsource

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pod(name string, slots int32) Pod { return Pod{Name: name, UID: "uid-" + name, Slots: slots} }

func TestSubscribeSnapshotAndOrder(t *testing.T) {
	s := NewHub(nil)
	s.Publish(Event{Type: PodReady, Pod: pod("a", 1)})
	events, snap, cancel := s.Subscribe()
	defer cancel()
	if len(snap) != 1 || snap[0].Name != "a" {
		t.Fatalf("snapshot %v", snap)
	}
	s.Publish(Event{Type: PodReady, Pod: pod("b", 1)})
	s.Publish(Event{Type: PodGone, Pod: pod("a", 1), Reason: ReasonExited})
	for _, want := range []string{"Ready b", "Gone a"} {
		ev := <-events
		if got := fmt.Sprintf("%s %s", ev.Type, ev.Pod.Name); got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}
	if pods := s.Pods(); len(pods) != 1 || pods[0].Name != "b" {
		t.Fatalf("Pods() = %v", pods)
	}
}

// A subscriber that does not read neither blocks the publisher nor loses
// a PodGone; its queue is compacted.
func TestSlowSubscriberQueueCompacts(t *testing.T) {
	s := NewHub(nil)
	events, _, cancel := s.Subscribe()
	defer cancel()
	s.Publish(Event{Type: PodReady, Pod: pod("a", 1)})
	s.Publish(Event{Type: PodReady, Pod: pod("b", 1)})
	s.Publish(Event{Type: PodReady, Pod: pod("c", 1)})
	s.Publish(Event{Type: PodReady, Pod: pod("a", 8)}) // replaces a's queued Ready in place
	s.Publish(Event{Type: PodGone, Pod: pod("b", 1), Reason: ReasonExited})
	const dead = 5000
	for i := range dead {
		p := pod(fmt.Sprint("x", i), 1)
		s.Publish(Event{Type: PodReady, Pod: p})
		s.Publish(Event{Type: PodGone, Pod: p, Reason: ReasonUnhealthy})
	}
	// The delivery goroutine may already hold the first Ready of a, sent
	// before the replacement: then the newer one is queued behind.
	str := func(ev Event) string { return fmt.Sprintf("%s %s %d", ev.Type, ev.Pod.Name, ev.Pod.Slots) }
	want := []string{"Ready a 8", "Ready c 1", "Gone b 1"}
	first := str(<-events)
	if first == "Ready a 1" {
		want = []string{"Ready c 1", "Ready a 8", "Gone b 1"}
	} else if first != want[0] {
		t.Fatalf("first event %s", first)
	} else {
		want = want[1:]
	}
	for i := range dead {
		want = append(want, fmt.Sprintf("Gone x%d 1", i))
	}
	for i, w := range want {
		if got := str(<-events); got != w {
			t.Fatalf("event %d: got %q, want %q", i, got, w)
		}
	}
}

func TestSubscriptionEnds(t *testing.T) {
	s := NewHub(nil)
	events, _, cancel := s.Subscribe()
	cancel()
	cancel() // twice is fine
	if _, ok := <-events; ok {
		t.Fatal("event after cancel")
	}

	events, _, cancel = s.Subscribe()
	defer cancel()
	s.Publish(Event{Type: PodReady, Pod: pod("a", 1)})
	s.Publish(Event{Type: PodGone, Pod: pod("a", 1), Reason: ReasonShutdown})
	s.End()
	var n int
	for range events {
		n++
	}
	if n == 0 {
		t.Fatal("queued events lost at the end")
	}
	late, snap, lateCancel := s.Subscribe()
	defer lateCancel()
	if _, ok := <-late; ok || len(snap) != 0 {
		t.Fatal("subscription after the end is open")
	}
}
