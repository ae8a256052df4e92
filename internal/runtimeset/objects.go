package runtimeset

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/pki"
)

// objects is the "runtime" controller: a Runtime's Deployment, and its
// namespace's ServiceAccount, Role, RoleBinding and TLS Secret.
type objects struct {
	client client.Client // the manager's: Runtimes and Deployments from its cache
	reader client.Reader // uncached, for what the cache does not watch
	issuer *pki.Issuer
	tokens *tokens
	opts   Options

	mu sync.Mutex
	// ensured remembers, per namespace, which Runtimes own its objects and
	// until when they need no look, so that a Runtime's reconcile reads
	// them from the API once per Resync rather than every time.
	ensured map[string]nsState
}

type nsState struct {
	owners map[types.UID]bool
	until  time.Time
}

func setupObjects(mgr ctrl.Manager, opts Options, issuer *pki.Issuer) error {
	r := &objects{
		client:  mgr.GetClient(),
		reader:  mgr.GetAPIReader(),
		issuer:  issuer,
		tokens:  &tokens{client: mgr.GetClient(), reader: mgr.GetAPIReader(), caData: caFrom(mgr.GetConfig()), now: opts.Clock.Now},
		opts:    opts,
		ensured: map[string]nsState{},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("runtime").
		For(&v1alpha1.Runtime{}).
		Owns(&appsv1.Deployment{}).
		Complete(r)
}

// Reconcile brings one Runtime's objects to what its spec says. A deleted
// Runtime needs nothing: the garbage collector follows the owner
// references.
func (r *objects) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rt v1alpha1.Runtime
	if err := r.client.Get(ctx, req.NamespacedName, &rt); err != nil {
		if apierrors.IsNotFound(err) {
			// Its token, if it had one, must not outlive it.
			_, err = r.tokens.sync(ctx, req.Namespace)
		}
		return ctrl.Result{}, err
	}
	if rt.DeletionTimestamp != nil {
		_, err := r.tokens.sync(ctx, req.Namespace)
		return ctrl.Result{}, err
	}
	until, err := r.ensureNamespace(ctx, &rt)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime %s: %w", req, err)
	}
	// The runtime-server container's token before the Pods that mount it.
	refresh, err := r.tokens.sync(ctx, rt.Namespace)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime %s: %w", req, err)
	}
	if !refresh.IsZero() && refresh.Before(until) {
		until = refresh
	}
	if err := r.ensureDeployment(ctx, &rt); err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime %s: %w", req, err)
	}
	return ctrl.Result{RequeueAfter: max(until.Sub(r.opts.Clock.Now()), time.Second)}, nil
}

// ownerRef makes rt one owner among others of a namespace object, so that
// the object goes when the last Runtime of its namespace goes.
func ownerRef(rt *v1alpha1.Runtime) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime, Name: rt.Name, UID: rt.UID}
}

// ensureNamespace keeps the ServiceAccount, Role, RoleBinding and TLS
// Secret of rt's namespace, each owned by rt among others, and returns
// when they need looking at again.
func (r *objects) ensureNamespace(ctx context.Context, rt *v1alpha1.Runtime) (time.Time, error) {
	now := r.opts.Clock.Now()
	r.mu.Lock()
	st, ok := r.ensured[rt.Namespace]
	r.mu.Unlock()
	if ok && st.owners[rt.UID] && now.Before(st.until) {
		return st.until, nil
	}
	owner := ownerRef(rt)
	ns := rt.Namespace
	if err := r.ensure(ctx, runtimedServiceAccount(ns), owner, nil); err != nil {
		return time.Time{}, err
	}
	if err := r.ensure(ctx, runtimedRole(ns), owner, func(stored client.Object) bool {
		role := stored.(*rbacv1.Role)
		if equality.Semantic.DeepEqual(role.Rules, RuntimedRules) {
			return false
		}
		role.Rules = RuntimedRules
		return true
	}); err != nil {
		return time.Time{}, err
	}
	want := runtimedRoleBinding(ns)
	if err := r.ensure(ctx, want, owner, func(stored client.Object) bool {
		rb := stored.(*rbacv1.RoleBinding)
		if equality.Semantic.DeepEqual(rb.Subjects, want.Subjects) {
			return false
		}
		rb.Subjects = want.Subjects
		return true
	}); err != nil {
		return time.Time{}, err
	}
	renewAt, err := r.issuer.EnsureRuntimedTLS(ctx, ns, &owner)
	if err != nil {
		return time.Time{}, err
	}
	until := now.Add(r.opts.Resync)
	if renewAt.Before(until) {
		until = renewAt
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st = r.ensured[ns]
	if st.owners == nil {
		st.owners = map[types.UID]bool{}
	}
	st.owners[rt.UID] = true
	st.until = until
	r.ensured[ns] = st
	return until, nil
}

// ensure creates want owned by owner, or makes the stored object carry
// owner among its owners and, when sync is given, what sync puts back
// (sync reports whether it changed anything).
func (r *objects) ensure(ctx context.Context, want client.Object, owner metav1.OwnerReference, sync func(stored client.Object) bool) error {
	kind := fmt.Sprintf("%T", want)
	return retry.OnError(retry.DefaultRetry, raced, func() error {
		stored := want.DeepCopyObject().(client.Object)
		err := r.reader.Get(ctx, client.ObjectKeyFromObject(want), stored)
		if apierrors.IsNotFound(err) {
			obj := want.DeepCopyObject().(client.Object)
			obj.SetOwnerReferences([]metav1.OwnerReference{owner})
			if err := r.client.Create(ctx, obj); err != nil {
				return fmt.Errorf("create %s %s/%s: %w", kind, want.GetNamespace(), want.GetName(), err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get %s %s/%s: %w", kind, want.GetNamespace(), want.GetName(), err)
		}
		changed := sync != nil && sync(stored)
		if refs := stored.GetOwnerReferences(); !slices.ContainsFunc(refs, func(o metav1.OwnerReference) bool { return o.UID == owner.UID }) {
			stored.SetOwnerReferences(append(refs, owner))
			changed = true
		}
		if !changed {
			return nil
		}
		if err := r.client.Update(ctx, stored); err != nil {
			return fmt.Errorf("update %s %s/%s: %w", kind, want.GetNamespace(), want.GetName(), err)
		}
		return nil
	})
}

// raced are the errors after which a re-read sees what another writer
// did: a lost create or a stale update.
func raced(err error) bool {
	return apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)
}

// ensureDeployment creates rt's Deployment, or rewrites its replicas and
// Pod template when the Runtime's spec no longer hashes to what the
// Deployment was written from. A conflict returns the error; the
// controller retries from its cache.
func (r *objects) ensureDeployment(ctx context.Context, rt *v1alpha1.Runtime) error {
	want := Deployment(rt, r.opts)
	if err := controllerutil.SetControllerReference(rt, want, r.client.Scheme()); err != nil {
		return err
	}
	var d appsv1.Deployment
	err := r.client.Get(ctx, client.ObjectKeyFromObject(want), &d)
	if apierrors.IsNotFound(err) {
		if err := r.client.Create(ctx, want); err != nil {
			return fmt.Errorf("create deployment: %w", err)
		}
		r.opts.Logger.Info("created the runtime's deployment", "namespace", rt.Namespace, "runtime", rt.Name, "replicas", rt.Spec.Replicas)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get deployment: %w", err)
	}
	if !metav1.IsControlledBy(&d, rt) {
		return fmt.Errorf("deployment %s/%s exists and belongs to something else", d.Namespace, d.Name)
	}
	if d.Annotations[AnnotationTemplateHash] == want.Annotations[AnnotationTemplateHash] {
		return nil
	}
	d.Spec.Replicas = want.Spec.Replicas
	d.Spec.Template = want.Spec.Template
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[AnnotationTemplateHash] = want.Annotations[AnnotationTemplateHash]
	if err := r.client.Update(ctx, &d); err != nil {
		return fmt.Errorf("update deployment: %w", err)
	}
	r.opts.Logger.Info("updated the runtime's deployment", "namespace", rt.Namespace, "runtime", rt.Name, "replicas", rt.Spec.Replicas)
	return nil
}
