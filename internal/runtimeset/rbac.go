package runtimeset

import (
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/pki"
)

// RuntimedRules are all runtimed may do, in its own namespace only:
//   - runs get, list, watch: its own Runs (it selects them by
//     status.assignedPodUID; RBAC cannot narrow a list that way);
//   - runs update: runtimed's finalizer on a function Run it holds
//     (metadata; the CRD's CEL rules keep the spec immutable);
//   - runs/status get, update, patch: the status it writes;
//   - leases get, create, update: its Pod's Lease.
//
// Nothing on Secrets, Pods, Runtimes, or anything cluster-wide. RBAC
// cannot narrow the writes to one Pod's Runs and Lease; the admission
// policies of deploy/controller/runtimed-policy.yaml do.
var RuntimedRules = []rbacv1.PolicyRule{
	{APIGroups: []string{v1alpha1.Group}, Resources: []string{"runs"}, Verbs: []string{"get", "list", "watch", "update"}},
	{APIGroups: []string{v1alpha1.Group}, Resources: []string{"runs/status"}, Verbs: []string{"get", "update", "patch"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
}

func managedMeta(namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: namespace,
		Name:      ServiceAccount,
		Labels:    map[string]string{pki.LabelManagedBy: pki.ManagedBy, LabelName: NameRuntimePod},
	}
}

func runtimedServiceAccount(namespace string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: managedMeta(namespace)}
}

func runtimedRole(namespace string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: managedMeta(namespace), Rules: RuntimedRules}
}

func runtimedRoleBinding(namespace string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: managedMeta(namespace),
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccount, Namespace: namespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ServiceAccount},
	}
}
