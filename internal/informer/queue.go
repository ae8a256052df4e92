package informer

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Key names an object within its kind.
type Key struct {
	Namespace, Name string
}

// KeyOf returns obj's key; an empty namespace is store.DefaultNamespace.
func KeyOf(obj metav1.Object) Key {
	return Key{Namespace: defaultNamespace(obj.GetNamespace()), Name: obj.GetName()}
}

// String returns "namespace/name".
func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Queue hands keys from informer handlers to a component's own goroutine:
// Add never blocks, a key that is already waiting is not added twice, and
// keys come out in the order they were first added. It is what a handler
// that must be fast enqueues into; the consumer then reads the current
// state of each key from the informer (level-triggered), so collapsing
// duplicates loses nothing.
type Queue struct {
	mu    sync.Mutex
	keys  []Key
	set   map[Key]struct{}
	ready chan struct{}
}

// NewQueue returns an empty Queue.
func NewQueue() *Queue {
	return &Queue{set: map[Key]struct{}{}, ready: make(chan struct{}, 1)}
}

// Add queues k unless it is already waiting.
func (q *Queue) Add(k Key) {
	q.mu.Lock()
	if _, ok := q.set[k]; !ok {
		q.set[k] = struct{}{}
		q.keys = append(q.keys, k)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Ready receives after an Add; the consumer then calls Take. A receive
// may find the queue empty (the keys were taken already).
func (q *Queue) Ready() <-chan struct{} { return q.ready }

// Take removes and returns every waiting key, oldest first.
func (q *Queue) Take() []Key {
	q.mu.Lock()
	defer q.mu.Unlock()
	keys := q.keys
	q.keys = nil
	clear(q.set)
	return keys
}

// Len returns the number of waiting keys.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys)
}
