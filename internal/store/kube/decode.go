package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	kjson "sigs.k8s.io/json"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// The store decodes the API server's JSON itself, once, into the typed
// object: client-go's decoders first read the whole document again to
// find its apiVersion and kind (the store knows both), and a watch event
// is framed, decoded into a WatchEvent with a raw copy of the object, and
// only then decoded into the object. docs/benchmarks.md has the figures.

// decodeInto decodes a response body into out as client-go would
// (case-sensitive field names, integers kept as int64 in untyped maps).
func decodeInto(body []byte, out any) error {
	if err := kjson.UnmarshalCaseSensitivePreserveInts(body, out); err != nil {
		return fmt.Errorf("decode the API server's answer: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

// wireEvent is a watch event as the API server sends it (metav1.WatchEvent
// with its object typed).
type wireEvent[O any] struct {
	Type   watch.EventType `json:"type"`
	Object O               `json:"object"`
}

// eventReader reads the watch events of one API watch response.
type eventReader[T any] struct {
	dec  *json.Decoder
	lim  *eventLimit
	raw  json.RawMessage
	body io.Closer
}

func newEventReader[T any](body io.ReadCloser) *eventReader[T] {
	lim := &eventLimit{r: body}
	return &eventReader[T]{dec: json.NewDecoder(lim), lim: lim, body: body}
}

// maxEvent bounds what one event may read from the stream: an object at
// bounds.StoredObject, its envelope, and what the decoder reads ahead of
// the next event.
const maxEvent = 2 * bounds.StoredObject

var errEventTooLarge = fmt.Errorf("a watch event exceeds %d bytes: %w", maxEvent, errdefs.ErrInternal)

// eventLimit fails a read past maxEvent bytes since its last reset.
type eventLimit struct {
	r    io.Reader
	left int
}

func (l *eventLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errEventTooLarge
	}
	n, err := l.r.Read(p[:min(len(p), l.left)])
	l.left -= n
	return n, err
}

// errStreamEnded is read's error when the API server ended the stream, or
// the connection broke: the watch resumes from the last version seen.
var errStreamEnded = errors.New("watch stream ended")

// read returns the next event; an ERROR event comes back as the API's
// error, the end of the stream (or a broken connection) as
// errStreamEnded.
func (r *eventReader[T]) read(newObj func() T) (watch.EventType, T, error) {
	var zero T
	r.raw = r.raw[:0]
	r.lim.left = maxEvent
	if err := r.dec.Decode(&r.raw); err != nil {
		var syntax *json.SyntaxError
		switch {
		case errors.Is(err, errEventTooLarge):
			return "", zero, err
		case errors.As(err, &syntax):
			return "", zero, fmt.Errorf("a watch event is not JSON: %v: %w", err, errdefs.ErrInternal)
		}
		return "", zero, errStreamEnded
	}
	typ, err := eventType(r.raw)
	if err != nil {
		return "", zero, err
	}
	if typ == watch.Error {
		ev := wireEvent[*metav1.Status]{Object: &metav1.Status{}}
		if err := decodeInto(r.raw, &ev); err != nil {
			return "", zero, err
		}
		return typ, zero, apierrors.FromObject(ev.Object)
	}
	ev := wireEvent[T]{Object: newObj()}
	if err := decodeInto(r.raw, &ev); err != nil {
		return "", zero, err
	}
	return ev.Type, ev.Object, nil
}

// typePrefix is how the API server starts every watch event: it encodes
// metav1.WatchEvent, whose type field comes first.
var typePrefix = []byte(`{"type":"`)

// eventType is a watch event's type, read from its first bytes when they
// are as the API server writes them (the object is decoded once, later),
// else by decoding the event.
func eventType(raw []byte) (watch.EventType, error) {
	if rest, ok := bytes.CutPrefix(raw, typePrefix); ok {
		if i := bytes.IndexByte(rest, '"'); i > 0 && bytes.IndexByte(rest[:i], '\\') < 0 {
			return watch.EventType(rest[:i]), nil
		}
	}
	var head struct {
		Type watch.EventType `json:"type"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return "", fmt.Errorf("a watch event: %v: %w", err, errdefs.ErrInternal)
	}
	return head.Type, nil
}

func (r *eventReader[T]) close() error { return r.body.Close() }
