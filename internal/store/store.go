// Package store is the boundary between Stoke's control plane and where Runs
// and Runtimes are kept. The control plane (scheduler, retry engine, stale
// reaper, runtimed, the gateway's owner cache) talks only to the interfaces
// here; standalone mode implements them over an embedded SQLite database
// (internal/store/sqlite) and Kubernetes mode over the Kubernetes API with
// Run and Runtime as CRDs. Both implementations pass the one conformance
// suite in internal/store/storetest, so the semantics below are Kubernetes'
// semantics for a custom resource with a status subresource, narrowed to
// what Stoke uses:
//
//   - Identity is kind + namespace + name. An empty namespace on a single
//     object means DefaultNamespace; in List and Watch it means "all
//     namespaces".
//   - metadata.resourceVersion is set by the store on every write; every
//     write gives a new value. It is opaque, as Kubernetes says: callers
//     compare it for equality and hand it back to Update, Delete and Watch,
//     never for order (the order of writes is the order Watch delivers
//     them). The SQLite store happens to use one growing decimal counter
//     for both kinds, its own tests check that; the suite does not. It
//     says so by implementing VersionOrder, which only code that runs on
//     SQLite alone may rely on (the informer's WaitForResourceVersion).
//   - Writes are optimistic: Update and UpdateStatus carry the
//     resourceVersion they read, and a stale one fails with
//     errdefs.ErrConflict. The caller re-reads and retries.
//   - Spec and metadata are written with Update, status with UpdateStatus;
//     each ignores the other's part, so the writer of the spec (a user, the
//     CLI) and the writers of status (scheduler, runtimed) never overwrite
//     each other. Create ignores status, as the API server does for a CRD
//     with a status subresource: a new Run has an empty phase until its first
//     UpdateStatus.
//   - Deletion honours finalizers: Delete of an object with finalizers only
//     sets metadata.deletionTimestamp; the object goes away when an Update
//     removes its last finalizer.
//   - Watch delivers every change after a resourceVersion, in commit order,
//     without gaps or duplicates, so that List followed by Watch from the
//     list's resourceVersion is an exact mirror (what an informer does).
//     History is bounded: a watch that starts, or falls, too far behind ends
//     with an error wrapping errdefs.ErrExpired and the watcher re-lists.
//
// Errors wrap the errdefs categories (ErrNotFound, ErrAlreadyExists,
// ErrConflict, ErrInvalidArgument, ErrExpired, ErrTooLarge, ErrUnavailable)
// and name the object as "<kind> <namespace>/<name>".
package store

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// DefaultNamespace is the namespace of an object written without one.
const DefaultNamespace = "default"

// Object is a kind the store keeps. The type set is closed on purpose: each
// kind needs its own status/spec split, and the Kubernetes implementation
// needs a CRD per kind.
type Object interface {
	*v1alpha1.Run | *v1alpha1.Runtime | *v1alpha1.Function | *v1alpha1.WorkflowRun | *v1alpha1.Workflow
	metav1.Object
	runtime.Object
}

// Reader reads objects of one kind. Returned objects are the caller's own
// deep copies.
type Reader[T Object] interface {
	// Get returns the object, or an error wrapping errdefs.ErrNotFound.
	Get(ctx context.Context, namespace, name string) (T, error)
	// List returns the objects matching opts, in no particular order, and
	// the resourceVersion the list is consistent with: a Watch from it
	// sees exactly the changes made after the list. That version is never
	// "" or "0" (which Watch reads as "from now"), even for an empty
	// store, so that list-then-watch never skips the writes in between.
	List(ctx context.Context, opts ListOptions) (items []T, resourceVersion string, err error)
}

// VersionOrder is implemented by a Resource whose resourceVersions are
// ordered, which the contract above does not promise: the SQLite store's
// are one growing decimal counter. The Kubernetes store does not implement
// it: Kubernetes calls resourceVersions opaque (they happen to be etcd
// revisions, which no API promises).
type VersionOrder interface {
	// CompareResourceVersions returns -1, 0 or +1 as version a is older
	// than, the same as or newer than b, or an error wrapping
	// errdefs.ErrInvalidArgument when either is not a version of the store.
	CompareResourceVersions(a, b string) (int, error)
}

// Writer creates, updates and deletes objects of one kind.
type Writer[T Object] interface {
	// Create stores a new object and returns it as stored. The store sets
	// metadata.uid (a random UUID), resourceVersion, creationTimestamp and
	// generation (1), clears deletionTimestamp and drops status. The name
	// is metadata.name, or metadata.generateName plus a random suffix when
	// the name is empty. A set resourceVersion is InvalidArgument; a name
	// that exists is AlreadyExists.
	Create(ctx context.Context, obj T) (T, error)
	// Update writes the spec and the mutable metadata (labels,
	// annotations, finalizers, ownerReferences) of an existing object;
	// status and the system metadata (uid, creationTimestamp,
	// deletionTimestamp, generation) are kept as stored. A spec change
	// increments metadata.generation. obj.resourceVersion must equal the
	// stored one (empty is InvalidArgument, stale is Conflict); a set uid
	// that differs is Conflict. An update that changes nothing writes
	// nothing and returns the stored object with its old resourceVersion.
	// Removing the last finalizer of an object that has a
	// deletionTimestamp deletes it (watchers see Deleted) and returns its
	// final state; adding a finalizer to such an object is
	// InvalidArgument.
	Update(ctx context.Context, obj T) (T, error)
	// Delete deletes the object. Without finalizers it is removed at once;
	// with finalizers its deletionTimestamp is set (once: deleting again
	// changes nothing) and it stays until the last finalizer is removed.
	// A precondition that does not match is Conflict; a missing object is
	// NotFound.
	Delete(ctx context.Context, namespace, name string, opts DeleteOptions) error
}

// StatusWriter writes the status of objects of one kind.
type StatusWriter[T Object] interface {
	// UpdateStatus writes obj's status; spec and metadata are kept as
	// stored. The optimistic rule is Update's, including the no-op case.
	UpdateStatus(ctx context.Context, obj T) (T, error)
}

// Resource is everything the store does with one kind. Code that only reads
// should ask for a Reader, code that only reports progress for a
// StatusWriter.
type Resource[T Object] interface {
	Reader[T]
	Writer[T]
	StatusWriter[T]
	// Watch streams the changes after opts.ResourceVersion. It fails with
	// an error wrapping errdefs.ErrExpired when that version is older than
	// the kept history (an implementation may instead deliver the same
	// error as the first event); the caller re-lists. A version that does
	// not parse is InvalidArgument. The watch ends, and its channel closes, when ctx ends, Stop is called,
	// the store closes, or after an Error event.
	Watch(ctx context.Context, opts WatchOptions) (Watcher[T], error)
}

// Store holds every kind. Close ends every watch and releases the store;
// further calls fail with errdefs.ErrUnavailable.
type Store interface {
	Runs() Resource[*v1alpha1.Run]
	Runtimes() Resource[*v1alpha1.Runtime]
	Functions() Resource[*v1alpha1.Function]
	WorkflowRuns() Resource[*v1alpha1.WorkflowRun]
	Workflows() Resource[*v1alpha1.Workflow]
	Close() error
}

// ListOptions selects objects. The zero value selects everything.
type ListOptions struct {
	// Namespace limits the list to one namespace; "" means all.
	Namespace string
	// LabelSelector limits the list to objects whose labels match; nil
	// means everything.
	LabelSelector labels.Selector
	// Phases limits a Run list to Runs whose status.phase is one of these
	// (the empty phase selects Runs whose status has not been written yet).
	// Empty means every phase. It is InvalidArgument for kinds without a
	// phase. In Kubernetes this is a field selector on status.phase.
	Phases []v1alpha1.Phase
	// AssignedPodUID limits a Run list to Runs whose
	// status.assignedPodUID is this UID (a runtime pod's runtimed lists
	// only its own Runs); "" means no limit. It is InvalidArgument for
	// kinds other than Run. In Kubernetes this is a field selector on
	// status.assignedPodUID.
	AssignedPodUID string
	// PlacedPodUID limits a Run list to Runs whose spec.placement.podUID
	// is this UID (a runtimed's Runs placed at their create, before any
	// assignment: v1alpha1.AnnotationPlaced); "" means no limit. It is
	// InvalidArgument for kinds other than Run. In Kubernetes this is a
	// field selector on spec.placement.podUID.
	PlacedPodUID string
}

// DeleteOptions are conditions on a delete.
type DeleteOptions struct {
	Preconditions Preconditions
}

// Preconditions must hold for a delete to happen; an empty field is not
// checked. They stop a delete from hitting a newer object of the same name
// (UID) or a changed one (ResourceVersion).
type Preconditions struct {
	UID             string
	ResourceVersion string
}

// WatchOptions selects what a watch sees.
type WatchOptions struct {
	// ResourceVersion is where the watch starts: events with a larger
	// resourceVersion are delivered. "" or "0" starts at the current
	// version (only future changes); after a List, pass its
	// resourceVersion.
	ResourceVersion string
	// Namespace limits the watch to one namespace; "" means all.
	Namespace string
	// AssignedPodUID limits a Run watch to Runs whose
	// status.assignedPodUID is this UID; "" means no limit. It is
	// InvalidArgument for kinds other than Run. As with a Kubernetes field
	// selector, the watch sees the set of matching Runs change: a Run that
	// comes to match (a write assigns it to the pod) is Added, one that
	// stops matching (reassigned, or deleted) is Deleted, carrying its
	// last matching state at the resourceVersion of the write that took it
	// out, and writes to a Run that matches before and after are
	// Modified. Writes to Runs that match neither before nor after are not
	// seen.
	AssignedPodUID string
	// PlacedPodUID limits a Run watch to Runs whose spec.placement.podUID
	// is this UID, as ListOptions.PlacedPodUID; with AssignedPodUID too,
	// a Run must match both.
	PlacedPodUID string
	// Phase limits a Run watch to Runs whose status.phase is this phase;
	// "" means every phase (a watch selects one phase at most: unlike a
	// list's several, one phase is exact as a Kubernetes field selector).
	// It is InvalidArgument for kinds without a phase. The set it selects
	// changes as AssignedPodUID's does: a Run entering the phase is Added,
	// one leaving it Deleted. With AssignedPodUID too, a Run must match
	// both.
	Phase v1alpha1.Phase
}

// EventType says what happened to an object. The values are Kubernetes'
// watch event types.
type EventType string

// Event types.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	// Error ends a watch; Event.Err says why. An error wrapping
	// errdefs.ErrExpired means the history needed is gone: re-list.
	Error EventType = "ERROR"
)

// Event is one change seen by a watch.
type Event[T Object] struct {
	Type EventType
	// Object is the object after the change; for Deleted, its last state
	// with the resourceVersion of the deletion. Nil for Error. It is the
	// receiver's own copy.
	Object T
	// Err is set for Error only.
	Err error
}

// Watcher is one running watch.
type Watcher[T Object] interface {
	// Events delivers the changes in commit order. It is closed when the
	// watch ends. The buffer behind it is bounded: a receiver that falls too
	// far behind gets an Error event wrapping errdefs.ErrExpired instead of
	// slowing down writers or other watchers.
	Events() <-chan Event[T]
	// Stop ends the watch and waits until its channel is closed. It is safe
	// to call more than once and from any goroutine.
	Stop()
}
