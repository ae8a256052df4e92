package sqlite

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// resource implements store.Resource and store.VersionOrder for one kind.
type resource[T store.Object] struct {
	c *core
	k *kind[T]
	// watchers are the live watches of this kind; guarded by c.mu.
	watchers map[*watcher[T]]struct{}
	// cache holds the current state of recently written objects, for
	// the writer only; guarded by c.mu. Entries change as a batch of
	// writes runs, under the same lock as every batch, so an entry is
	// what the batch's transaction holds; a batch that does not commit
	// clears the cache.
	cache      map[objectKey]*current[T]
	cacheBytes int // the bodies' size in all
	// The cache's bounds: writeCacheEntries and writeCacheBytes, smaller
	// in tests.
	maxEntries, maxBytes int
}

// objectKey is an object's identity within its kind.
type objectKey struct{ namespace, name string }

// current is the stored state of one object: its version, its JSON, and
// the decoded object (with the version set), which nobody mutates.
type current[T store.Object] struct {
	rv   int64
	body []byte
	obj  T
}

// Bounds of each kind's write cache. A Run is written several times within
// seconds of its creation (scheduled, running, finished), so a small cache
// turns most writes' read and decode of the old state into a map lookup.
// The byte bound counts stored JSON (the decoded objects take a few times
// more) and keeps Runs that carry archives from filling memory.
const (
	writeCacheEntries = 4096
	writeCacheBytes   = 16 << 20
)

var (
	_ store.Resource[*v1alpha1.Run]     = (*resource[*v1alpha1.Run])(nil)
	_ store.Resource[*v1alpha1.Runtime] = (*resource[*v1alpha1.Runtime])(nil)
)

func newResource[T store.Object](c *core, k *kind[T]) *resource[T] {
	r := &resource[T]{
		c:          c,
		k:          k,
		watchers:   map[*watcher[T]]struct{}{},
		cache:      map[objectKey]*current[T]{},
		maxEntries: writeCacheEntries,
		maxBytes:   writeCacheBytes,
	}
	c.kinds = append(c.kinds, r)
	return r
}

// errorf names the object and wraps category.
func (r *resource[T]) errorf(namespace, name string, category error, format string, args ...any) error {
	return fmt.Errorf("%s %s/%s: %s: %w", r.k.noun, namespace, name, fmt.Sprintf(format, args...), category)
}

func (r *resource[T]) notFound(namespace, name string) error {
	return fmt.Errorf("%s %s/%s: %w", r.k.noun, namespace, name, errdefs.ErrNotFound)
}

// encode returns the JSON stored for obj. The resourceVersion is left out:
// it lives in its own column, so that two bodies compare equal exactly when
// nothing but the version differs.
func (r *resource[T]) encode(obj T) ([]byte, error) {
	rv := obj.GetResourceVersion()
	obj.SetResourceVersion("")
	body, err := json.Marshal(obj)
	obj.SetResourceVersion(rv)
	if err != nil {
		return nil, r.errorf(obj.GetNamespace(), obj.GetName(), errdefs.ErrInvalidArgument, "encode: %v", err)
	}
	if len(body) > maxObjectBytes {
		return nil, r.errorf(obj.GetNamespace(), obj.GetName(), errdefs.ErrTooLarge, "object is %d bytes, the limit is %d", len(body), maxObjectBytes)
	}
	return body, nil
}

// decode turns a stored body back into an object carrying version rv.
func (r *resource[T]) decode(body []byte, rv int64) (T, error) {
	obj := r.k.new()
	if err := json.Unmarshal(body, obj); err != nil {
		var zero T
		return zero, fmt.Errorf("decode %s at resourceVersion %d: %w", r.k.noun, rv, err)
	}
	obj.SetResourceVersion(formatRV(rv))
	return obj, nil
}

func formatRV(rv int64) string { return strconv.FormatInt(rv, 10) }

// load returns the stored state for a write; the caller holds c.mu and tx
// is its transaction.
func (r *resource[T]) load(ctx context.Context, tx *sql.Tx, namespace, name string) (*current[T], error) {
	if cur, ok := r.cache[objectKey{namespace, name}]; ok {
		return cur, nil
	}
	cur := &current[T]{}
	err := tx.StmtContext(ctx, r.c.selectObject).QueryRowContext(ctx, r.k.name, namespace, name).Scan(&cur.rv, &cur.body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, r.notFound(namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s %s/%s: %w", r.k.noun, namespace, name, err)
	}
	if cur.obj, err = r.decode(cur.body, cur.rv); err != nil {
		return nil, err
	}
	r.remember(cur)
	return cur, nil
}

// remember puts a committed state into the write cache, making room by
// dropping arbitrary other entries (map order is random): the cache only
// saves reads, so which entries go matters little. The caller holds c.mu.
func (r *resource[T]) remember(cur *current[T]) {
	key := objectKey{cur.obj.GetNamespace(), cur.obj.GetName()}
	r.forget(key)
	r.cache[key] = cur
	r.cacheBytes += len(cur.body)
	for k := range r.cache {
		if len(r.cache) <= r.maxEntries && r.cacheBytes <= r.maxBytes {
			break
		}
		if k != key {
			r.forget(k)
		}
	}
}

// forget drops one entry from the write cache; the caller holds c.mu.
func (r *resource[T]) forget(key objectKey) {
	if cur, ok := r.cache[key]; ok {
		r.cacheBytes -= len(cur.body)
		delete(r.cache, key)
	}
}

// resetCache implements kindState.
func (r *resource[T]) resetCache() {
	clear(r.cache)
	r.cacheBytes = 0
}

// CompareResourceVersions implements store.VersionOrder: both kinds share
// one growing decimal counter.
func (r *resource[T]) CompareResourceVersions(a, b string) (int, error) {
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	if err := errors.Join(errA, errB); err != nil {
		return 0, fmt.Errorf("compare resourceVersions %q and %q: not the store's: %w", a, b, errdefs.ErrInvalidArgument)
	}
	return cmp.Compare(x, y), nil
}

// Get implements store.Reader. It reads the database, not the write cache,
// so that it never sees a write before the write's commit is visible to
// List as well.
func (r *resource[T]) Get(ctx context.Context, namespace, name string) (T, error) {
	var zero T
	if r.c.closedFlag.Load() {
		return zero, errClosed()
	}
	namespace = defaultNamespace(namespace)
	var (
		rv   int64
		body []byte
	)
	err := r.c.getObject.QueryRowContext(ctx, r.k.name, namespace, name).Scan(&rv, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return zero, r.notFound(namespace, name)
	}
	if err != nil {
		return zero, fmt.Errorf("get %s %s/%s: %w", r.k.noun, namespace, name, r.c.readErr(err))
	}
	return r.decode(body, rv)
}

// List implements store.Reader. Namespace and phase are filtered in SQL,
// labels after decoding. The resourceVersion is read in the same read
// transaction as the rows: every commit appends to events, so the largest
// event in the snapshot is the version the rows are consistent with.
func (r *resource[T]) List(ctx context.Context, opts store.ListOptions) ([]T, string, error) {
	if r.c.closedFlag.Load() {
		return nil, "", errClosed()
	}
	if len(opts.Phases) > 0 && !r.k.hasPhase {
		return nil, "", fmt.Errorf("list %ss: a phase filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if opts.AssignedPodUID != "" && r.k.assignedPodUID == nil {
		return nil, "", fmt.Errorf("list %ss: an assigned pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	if opts.PlacedPodUID != "" && r.k.placedPodUID == nil {
		return nil, "", fmt.Errorf("list %ss: a placed pod filter does not apply to this kind: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	var q strings.Builder
	args := []any{r.k.name}
	q.WriteString(`SELECT resource_version, body FROM objects WHERE kind = ?`)
	if opts.Namespace != "" {
		q.WriteString(` AND namespace = ?`)
		args = append(args, opts.Namespace)
	}
	if len(opts.Phases) > 0 {
		q.WriteString(` AND phase IN (?` + strings.Repeat(`, ?`, len(opts.Phases)-1) + `)`)
		for _, p := range opts.Phases {
			args = append(args, string(p))
		}
	}
	q.WriteString(` ORDER BY namespace, name`)

	tx, err := r.c.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, r.c.readErr(err))
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var listRV int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(rv), 0) FROM events`).Scan(&listRV); err != nil {
		return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, err)
	}
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, err)
	}
	defer rows.Close()
	var items []T
	for rows.Next() {
		var (
			rv   int64
			body []byte
		)
		if err := rows.Scan(&rv, &body); err != nil {
			return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, err)
		}
		obj, err := r.decode(body, rv)
		if err != nil {
			return nil, "", err
		}
		if opts.LabelSelector != nil && !opts.LabelSelector.Matches(labels.Set(obj.GetLabels())) {
			continue
		}
		if opts.AssignedPodUID != "" && r.k.assignedPodUID(obj) != opts.AssignedPodUID {
			continue
		}
		if opts.PlacedPodUID != "" && r.k.placedPodUID(obj) != opts.PlacedPodUID {
			continue
		}
		items = append(items, obj)
		// The log always keeps its latest event, so this changes nothing
		// unless the log was tampered with; the version must still cover
		// every item listed.
		listRV = max(listRV, rv)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list %ss: %w", r.k.noun, err)
	}
	return items, formatRV(listRV), nil
}

// Create implements store.Writer.
func (r *resource[T]) Create(ctx context.Context, in T) (T, error) {
	var zero T
	if in == nil {
		return zero, fmt.Errorf("create %s: no object: %w", r.k.noun, errdefs.ErrInvalidArgument)
	}
	obj := in.DeepCopyObject().(T)
	namespace := defaultNamespace(obj.GetNamespace())
	obj.SetNamespace(namespace)
	generate := obj.GetName() == ""
	if generate && obj.GetGenerateName() == "" {
		return zero, fmt.Errorf("create %s in %s: metadata.name or metadata.generateName is required: %w", r.k.noun, namespace, errdefs.ErrInvalidArgument)
	}
	if obj.GetResourceVersion() != "" {
		return zero, r.errorf(namespace, obj.GetName(), errdefs.ErrInvalidArgument, "resourceVersion must not be set on create")
	}
	if err := r.validateMeta(obj); err != nil {
		return zero, err
	}
	// Build the object in its stored form, so that what Create returns is
	// exactly what Get will decode without decoding it here: the spec goes
	// through JSON, empty maps and lists become nil (JSON omits them), and
	// the timestamp is whole seconds in local time, as metav1.Time decodes.
	if _, err := r.k.setSpec(obj, obj); err != nil {
		return zero, r.errorf(namespace, obj.GetName(), errdefs.ErrInvalidArgument, "spec: %v", err)
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk(r.k.name))
	obj.SetUID(uuid.NewUUID())
	obj.SetCreationTimestamp(metav1.NewTime(storedTime(r.c.opts.now())))
	obj.SetGeneration(1)
	obj.SetDeletionTimestamp(nil)
	obj.SetDeletionGracePeriodSeconds(nil)
	obj.SetManagedFields(nil)
	obj.SetLabels(cloneMap(obj.GetLabels()))
	obj.SetAnnotations(cloneMap(obj.GetAnnotations()))
	obj.SetFinalizers(cloneSlice(obj.GetFinalizers()))
	obj.SetOwnerReferences(cloneOwners(obj.GetOwnerReferences()))
	r.k.clearStatus(obj)

	// A generated name that collides is retried with a new suffix; the API
	// server makes its client retry, which is the same to the caller.
	for attempt := 1; ; attempt++ {
		if generate {
			obj.SetName(obj.GetGenerateName() + randomSuffix())
		}
		if err := r.validateName(namespace, obj.GetName()); err != nil {
			return zero, err
		}
		stored, err := r.create(ctx, obj)
		if generate && attempt < 5 && errors.Is(err, errdefs.ErrAlreadyExists) {
			continue
		}
		return stored, err
	}
}

func (r *resource[T]) create(ctx context.Context, obj T) (T, error) {
	var zero T
	namespace, name := obj.GetNamespace(), obj.GetName()
	body, err := r.encode(obj)
	if err != nil {
		return zero, err
	}
	stored := obj.DeepCopyObject().(T) // obj is reused if a generated name clashes
	c := r.c
	var out T
	err = c.write(ctx, func(ctx context.Context, tx *sql.Tx, rv int64) (func(), error) {
		res, err := tx.StmtContext(ctx, c.insertObject).ExecContext(ctx, r.k.name, namespace, name, string(obj.GetUID()), rv, r.k.phase(obj), body)
		if err != nil {
			return nil, fmt.Errorf("create %s %s/%s: %w", r.k.noun, namespace, name, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, fmt.Errorf("%s %s/%s: %w", r.k.noun, namespace, name, errdefs.ErrAlreadyExists)
		}
		stored.SetResourceVersion(formatRV(rv))
		return r.record(ctx, tx, store.Added, zero, &current[T]{rv: rv, body: body, obj: stored}, &out)
	})
	if err != nil {
		return zero, err
	}
	return out, nil
}

// record appends the event for the new state and updates the write cache,
// inside the batch's transaction; it sets *out to the caller's own copy of
// the new state, and returns what hands the state to the watchers once
// the batch has committed. prev is the state before the change (nil for
// Added), which watches filtered by assigned pod need. The caller holds
// c.mu.
func (r *resource[T]) record(ctx context.Context, tx *sql.Tx, typ store.EventType, prev T, next *current[T], out *T) (func(), error) {
	namespace, name := next.obj.GetNamespace(), next.obj.GetName()
	if err := r.c.appendEvent(ctx, tx, next.rv, r.k.name, typ, namespace, name, next.body); err != nil {
		return nil, fmt.Errorf("%s %s/%s: record event: %w", r.k.noun, namespace, name, err)
	}
	if typ == store.Deleted {
		r.forget(objectKey{namespace, name})
	} else {
		r.remember(next)
	}
	if out != nil {
		*out = next.obj.DeepCopyObject().(T)
	}
	return func() { r.fanout(typ, prev, next.obj) }, nil
}

// Update implements store.Writer.
func (r *resource[T]) Update(ctx context.Context, in T) (T, error) {
	return r.update(ctx, in, true)
}

// UpdateStatus implements store.StatusWriter.
func (r *resource[T]) UpdateStatus(ctx context.Context, in T) (T, error) {
	return r.update(ctx, in, false)
}

// update is Update (spec and metadata) and UpdateStatus (status only): it
// copies the writable part of in onto a copy of the stored object.
func (r *resource[T]) update(ctx context.Context, in T, spec bool) (T, error) {
	var zero T
	verb := "update status of"
	if spec {
		verb = "update"
	}
	if in == nil {
		return zero, fmt.Errorf("%s %s: no object: %w", verb, r.k.noun, errdefs.ErrInvalidArgument)
	}
	namespace, name := defaultNamespace(in.GetNamespace()), in.GetName()
	if name == "" {
		return zero, fmt.Errorf("%s %s in %s: metadata.name is required: %w", verb, r.k.noun, namespace, errdefs.ErrInvalidArgument)
	}
	if in.GetResourceVersion() == "" {
		return zero, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: resourceVersion must be set", verb)
	}
	if spec {
		if err := r.validateMeta(in); err != nil {
			return zero, err
		}
	}
	c := r.c
	var out T
	err := c.write(ctx, func(ctx context.Context, tx *sql.Tx, rv int64) (func(), error) {
		cur, err := r.load(ctx, tx, namespace, name)
		if err != nil {
			return nil, err
		}
		old := cur.obj
		if got, stored := in.GetResourceVersion(), old.GetResourceVersion(); got != stored {
			return nil, r.errorf(namespace, name, errdefs.ErrConflict, "%s: resourceVersion %s is stale, the stored object is at %s; re-read and retry", verb, got, stored)
		}
		if uid := in.GetUID(); uid != "" && uid != old.GetUID() {
			return nil, r.errorf(namespace, name, errdefs.ErrConflict, "%s: uid %s does not match the stored object's %s", verb, uid, old.GetUID())
		}
		next := old.DeepCopyObject().(T)
		if !spec {
			if err := r.k.setStatus(next, in); err != nil {
				return nil, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: %v", verb, err)
			}
		} else {
			newSpec, err := r.k.setSpec(next, in)
			if err != nil {
				return nil, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: %v", verb, err)
			}
			next.SetLabels(cloneMap(in.GetLabels()))
			next.SetAnnotations(cloneMap(in.GetAnnotations()))
			next.SetFinalizers(cloneSlice(in.GetFinalizers()))
			next.SetOwnerReferences(cloneOwners(in.GetOwnerReferences()))
			if old.GetDeletionTimestamp() != nil {
				for _, f := range next.GetFinalizers() {
					if !slices.Contains(old.GetFinalizers(), f) {
						return nil, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: finalizer %q cannot be added to an object being deleted", verb, f)
					}
				}
			}
			oldSpec, err := r.k.spec(old)
			if err != nil {
				return nil, r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s: encode spec: %v", verb, err)
			}
			if !bytes.Equal(oldSpec, newSpec) {
				next.SetGeneration(old.GetGeneration() + 1)
			}
		}
		body, err := r.encode(next)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(body, cur.body) {
			// Nothing changed: like the API server, write nothing, keep the
			// version and wake no watcher.
			out = old.DeepCopyObject().(T)
			return nil, nil
		}
		next.SetResourceVersion(formatRV(rv))
		if next.GetDeletionTimestamp() != nil && len(next.GetFinalizers()) == 0 {
			// The last finalizer is gone: the deletion completes now.
			if _, err := tx.StmtContext(ctx, c.deleteObject).ExecContext(ctx, r.k.name, namespace, name); err != nil {
				return nil, fmt.Errorf("%s %s %s/%s: %w", verb, r.k.noun, namespace, name, err)
			}
			return r.record(ctx, tx, store.Deleted, old, &current[T]{rv: rv, body: body, obj: next}, &out)
		}
		if _, err := tx.StmtContext(ctx, c.updateObject).ExecContext(ctx, rv, r.k.phase(next), body, r.k.name, namespace, name); err != nil {
			return nil, fmt.Errorf("%s %s %s/%s: %w", verb, r.k.noun, namespace, name, err)
		}
		return r.record(ctx, tx, store.Modified, old, &current[T]{rv: rv, body: body, obj: next}, &out)
	})
	if err != nil {
		return zero, err
	}
	return out, nil
}

// Delete implements store.Writer.
func (r *resource[T]) Delete(ctx context.Context, namespace, name string, opts store.DeleteOptions) error {
	namespace = defaultNamespace(namespace)
	c := r.c
	return c.write(ctx, func(ctx context.Context, tx *sql.Tx, rv int64) (func(), error) {
		cur, err := r.load(ctx, tx, namespace, name)
		if err != nil {
			return nil, err
		}
		old := cur.obj
		if uid := opts.Preconditions.UID; uid != "" && uid != string(old.GetUID()) {
			return nil, r.errorf(namespace, name, errdefs.ErrConflict, "delete: precondition uid %s does not match the stored object's %s", uid, old.GetUID())
		}
		if v := opts.Preconditions.ResourceVersion; v != "" && v != old.GetResourceVersion() {
			return nil, r.errorf(namespace, name, errdefs.ErrConflict, "delete: precondition resourceVersion %s does not match the stored object's %s", v, old.GetResourceVersion())
		}
		if len(old.GetFinalizers()) == 0 {
			if _, err := tx.StmtContext(ctx, c.deleteObject).ExecContext(ctx, r.k.name, namespace, name); err != nil {
				return nil, fmt.Errorf("delete %s %s/%s: %w", r.k.noun, namespace, name, err)
			}
			last := old.DeepCopyObject().(T)
			last.SetResourceVersion(formatRV(rv))
			return r.record(ctx, tx, store.Deleted, old, &current[T]{rv: rv, body: cur.body, obj: last}, nil)
		}
		if old.GetDeletionTimestamp() != nil {
			return nil, nil // already being deleted; waiting for its finalizers
		}
		next := old.DeepCopyObject().(T)
		now := metav1.NewTime(storedTime(c.opts.now()))
		next.SetDeletionTimestamp(&now)
		next.SetResourceVersion(formatRV(rv))
		body, err := r.encode(next)
		if err != nil {
			return nil, err
		}
		if _, err := tx.StmtContext(ctx, c.updateObject).ExecContext(ctx, rv, r.k.phase(next), body, r.k.name, namespace, name); err != nil {
			return nil, fmt.Errorf("delete %s %s/%s: %w", r.k.noun, namespace, name, err)
		}
		return r.record(ctx, tx, store.Modified, old, &current[T]{rv: rv, body: body, obj: next}, nil)
	})
}

// storedTime is t as a metav1.Time comes back from JSON: whole seconds,
// local time, no monotonic reading.
func storedTime(t time.Time) time.Time { return t.Truncate(time.Second).Local() }

func defaultNamespace(ns string) string {
	if ns == "" {
		return store.DefaultNamespace
	}
	return ns
}

// The clones below return nil for empty input: JSON drops empty maps and
// lists (omitempty), and the object a write returns must be what Get
// decodes.

func cloneMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func cloneSlice(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

func cloneOwners(refs []metav1.OwnerReference) []metav1.OwnerReference {
	if len(refs) == 0 {
		return nil
	}
	out := make([]metav1.OwnerReference, len(refs))
	for i := range refs {
		refs[i].DeepCopyInto(&out[i])
	}
	return out
}
