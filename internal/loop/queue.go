package loop

import "sync"

// Queue hands keys from any goroutine to a loop: Add never blocks, a key
// that is already waiting is not added twice, and keys come out in the
// order they were first added.
type Queue[K comparable] struct {
	mu    sync.Mutex
	keys  []K
	set   map[K]struct{}
	ready chan struct{}
}

// NewQueue returns an empty Queue.
func NewQueue[K comparable]() *Queue[K] {
	return &Queue[K]{set: map[K]struct{}{}, ready: make(chan struct{}, 1)}
}

// Add queues k unless it is already waiting.
func (q *Queue[K]) Add(k K) {
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
func (q *Queue[K]) Ready() <-chan struct{} { return q.ready }

// Take removes and returns every waiting key, oldest first.
func (q *Queue[K]) Take() []K {
	q.mu.Lock()
	defer q.mu.Unlock()
	keys := q.keys
	q.keys = nil
	clear(q.set)
	return keys
}

// Len returns the number of waiting keys.
func (q *Queue[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys)
}
