package standalone

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// PatchRun applies a JSON merge patch (RFC 7386) to a Run, as `kubectl
// patch --type merge` does: labels, annotations, the client's finalizers,
// spec.cancelRequested (false → true), spec.held (true → false) and
// spec.ttlSecondsAfterFinished may change; anything else the patch changes is InvalidArgument. Stoke's own
// finalizers (stoke.dev/…) stay as stored whatever the patch says of them.
// metadata.resourceVersion or metadata.uid in the patch are preconditions
// (Conflict when they do not match); without them the patch applies to
// the Run as it is, retried on conflicts. Removing the last finalizer of a
// Run being deleted deletes it; the Run is returned as it was then.
func (s *Standalone) PatchRun(ctx context.Context, namespace, name string, patch []byte) (*v1alpha1.Run, error) {
	var pre struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
			UID             string `json:"uid"`
		} `json:"metadata"`
	}
	if trimmed := bytes.TrimSpace(patch); len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errdefs.InvalidArgument("body", "a JSON merge patch is a JSON object")
	}
	if err := json.Unmarshal(patch, &pre); err != nil {
		return nil, errdefs.InvalidArgument("body", "not a JSON merge patch: %v", err)
	}
	attempt := func() (*v1alpha1.Run, error) {
		cur, err := s.store.Runs().Get(ctx, namespace, name)
		if err != nil {
			return nil, err
		}
		if rv := pre.Metadata.ResourceVersion; rv != "" && rv != cur.ResourceVersion {
			return nil, errdefs.Errorf(errdefs.ErrConflict, "run %s/%s: resourceVersion %s is not the current %s; read it again", namespace, name, rv, cur.ResourceVersion)
		}
		if uid := pre.Metadata.UID; uid != "" && uid != string(cur.UID) {
			return nil, errdefs.Errorf(errdefs.ErrConflict, "run %s/%s: uid %s is not the current %s", namespace, name, uid, cur.UID)
		}
		next, err := patched(cur, patch)
		if err != nil {
			return nil, err
		}
		if apiequality.Semantic.DeepEqual(cur, next) {
			return cur, nil
		}
		return s.store.Runs().Update(ctx, next)
	}
	if pre.Metadata.ResourceVersion != "" {
		// The client asked for this version: a race it lost is its to see.
		return attempt()
	}
	var out *v1alpha1.Run
	err := store.RetryOnConflict(func() error {
		var err error
		out, err = attempt()
		return err
	})
	return out, err
}

// patched is cur with the merge patch applied, or InvalidArgument when the
// patch changes what a client may not.
func patched(cur *v1alpha1.Run, patch []byte) (*v1alpha1.Run, error) {
	doc, err := json.Marshal(cur)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "run %s/%s: encode: %v", cur.Namespace, cur.Name, err)
	}
	merged, err := jsonpatch.MergePatch(doc, patch)
	if err != nil {
		return nil, errdefs.InvalidArgument("body", "not a JSON merge patch: %v", err)
	}
	next := &v1alpha1.Run{}
	dec := json.NewDecoder(bytes.NewReader(merged))
	dec.DisallowUnknownFields()
	if err := dec.Decode(next); err != nil {
		return nil, errdefs.InvalidArgument("body", "the patched Run is not a valid object: %v", err)
	}
	// Stoke's finalizers as stored, then the client's in the patch's order.
	finalizers := slices.DeleteFunc(slices.Clone(next.Finalizers), validation.IsStokeFinalizer)
	next.Finalizers = append(slices.DeleteFunc(slices.Clone(cur.Finalizers), func(f string) bool { return !validation.IsStokeFinalizer(f) }), finalizers...)
	if len(next.Finalizers) == 0 {
		next.Finalizers = nil
	}
	if !apiequality.Semantic.DeepEqual(cur.Status, next.Status) {
		return nil, errdefs.InvalidArgument("status", "is written by Stoke; a patch may not change it")
	}
	// Of the metadata, only labels, annotations and finalizers may change.
	system := func(m *metav1.ObjectMeta) *metav1.ObjectMeta {
		m = m.DeepCopy()
		m.Labels, m.Annotations, m.Finalizers, m.ResourceVersion = nil, nil, nil, ""
		return m
	}
	if !apiequality.Semantic.DeepEqual(system(&cur.ObjectMeta), system(&next.ObjectMeta)) {
		return nil, errdefs.InvalidArgument("metadata", "only labels, annotations and finalizers may change")
	}
	next.ResourceVersion = cur.ResourceVersion
	if err := validation.ValidateRunUpdate(cur, next); err != nil {
		return nil, err
	}
	return next, nil
}
