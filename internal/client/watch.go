package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
)

// EventType is the kind of change a watch event reports.
type EventType string

// Watch event types.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	// Error ends a stream; Next returns it as an error, never as an event.
	Error EventType = "ERROR"
)

// Event is one change of an object of type T (v1alpha1.Run or Runtime).
type Event[T any] struct {
	Type   EventType
	Object *T
}

// Watch is an open watch stream. Next reads it in the caller's goroutine;
// Close ends it. Cancelling the context the watch was opened with also
// ends it.
type Watch[T any] struct {
	next  func() (Event[T], error)
	close func() error
}

// NewWatch is a Watch whose events come from next and which close ends,
// for a backend other than *Client.
func NewWatch[T any](next func() (Event[T], error), close func() error) *Watch[T] {
	return &Watch[T]{next: next, close: close}
}

func watch[T any](ctx context.Context, c *Client, u *url.URL) (*Watch[T], error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, url: u})
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxObject)
	return NewWatch(func() (Event[T], error) { return nextEvent[T](sc, u.Path) }, resp.Body.Close), nil
}

// Next returns the next event. It returns io.EOF when the server closed
// the stream without an ERROR event, and an error for an ERROR event (an
// *APIError when the event carries Stoke's error body), a line over
// MaxObject, or a cancelled context.
func (w *Watch[T]) Next() (Event[T], error) { return w.next() }

// Close ends the watch.
func (w *Watch[T]) Close() error { return w.close() }

// nextEvent reads the next event of a watch answer.
func nextEvent[T any](sc *bufio.Scanner, path string) (Event[T], error) {
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var raw struct {
			Type   EventType       `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := json.Unmarshal(line, &raw); err != nil {
			return Event[T]{}, fmt.Errorf("watch %s: decoding an event: %w", path, err)
		}
		switch raw.Type {
		case Added, Modified, Deleted:
		case Error:
			return Event[T]{}, watchError(path, raw.Object)
		default:
			return Event[T]{}, fmt.Errorf("watch %s: unknown event type %q", path, raw.Type)
		}
		obj := new(T)
		if err := json.Unmarshal(raw.Object, obj); err != nil {
			return Event[T]{}, fmt.Errorf("watch %s: decoding a %s object: %w", path, raw.Type, err)
		}
		return Event[T]{Type: raw.Type, Object: obj}, nil
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Event[T]{}, errdefs.Errorf(errdefs.ErrTooLarge, "watch %s: an event exceeds %d bytes", path, MaxObject)
		}
		return Event[T]{}, fmt.Errorf("watch %s: %w", path, err)
	}
	return Event[T]{}, io.EOF
}

// watchError turns an ERROR event's object into an error. A watch ends
// this way when the server stops, so it is Unavailable whatever it says.
func watchError(path string, obj json.RawMessage) error {
	var body httpapi.ErrorBody
	if json.Unmarshal(obj, &body) == nil && body.ErrorMessage != "" {
		return errdefs.Errorf(errdefs.ErrUnavailable, "watch %s ended: %s", path, body.ErrorMessage)
	}
	return errdefs.Errorf(errdefs.ErrUnavailable, "watch %s ended by the server", path)
}
