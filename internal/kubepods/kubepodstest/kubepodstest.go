// Package kubepodstest fakes runtime Pods for tests against a real API
// server without a kubelet: it creates a Pod of a Runtime, writes its
// status (Ready, Pod IP) through the status subresource as a kubelet
// would, and creates and renews its Lease as its runtimed would. Nothing
// runs in such a Pod.
package kubepodstest

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/internal/kubepods"
)

// Pod is a fake runtime Pod as last written.
type Pod struct {
	*corev1.Pod
	kc kubernetes.Interface
}

// Create creates a Pod of the Runtime in namespace; nothing schedules or
// runs it.
func Create(t testing.TB, kc kubernetes.Interface, namespace, runtime, name string) *Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{kubepods.LabelRuntime: runtime}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runtime-server", Image: "stoke"}}},
	}
	pod, err := kc.CoreV1().Pods(namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &Pod{Pod: pod, kc: kc}
}

// SetReady writes the Pod's status: Running with ip, Ready or not.
func (p *Pod) SetReady(t testing.TB, ready bool, ip string) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod := p.DeepCopy()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}}
	pod, err := p.kc.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Pod = pod
}

// Renew creates or renews the Pod's Lease, held by its UID, for seconds.
func (p *Pod) Renew(t testing.TB, seconds int32) {
	t.Helper()
	if err := p.renew(t.Context(), seconds); err != nil {
		t.Fatal(err)
	}
}

// KeepRenewed renews the Pod's Lease every interval until ctx ends, as a
// live runtimed does; a failed renewal is reported with t.Error. It
// returns a channel closed when it has stopped.
func (p *Pod) KeepRenewed(ctx context.Context, t testing.TB, interval time.Duration, seconds int32) <-chan struct{} {
	done := make(chan struct{})
	tick := time.NewTicker(interval)
	go func() {
		defer close(done)
		defer tick.Stop()
		for {
			if err := p.renew(ctx, seconds); err != nil && ctx.Err() == nil {
				t.Errorf("renew the Lease of %s: %v", p.Name, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return done
}

func (p *Pod) renew(ctx context.Context, seconds int32) error {
	leases := p.kc.CoordinationV1().Leases(p.Namespace)
	now := metav1.NowMicro()
	lease, err := leases.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(string(p.UID)), LeaseDurationSeconds: ptr.To(seconds),
				AcquireTime: &now, RenewTime: &now}}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
	case err == nil:
		lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds = &now, ptr.To(seconds)
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	return err
}
