package kubetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	coreac "k8s.io/client-go/applyconfigurations/core/v1"
	discoveryac "k8s.io/client-go/applyconfigurations/discovery/v1"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// endpointSliceManager is the managed-by label of the slices
// endpointSlices writes.
const endpointSliceManager = "kubetest.stoke.dev"

// endpointSlices stands in for kube-controller-manager's EndpointSlice
// controller. The node agent's Pods have loopback IPs (127.0.x.y), which
// the API server refuses as the address of an IPv4 EndpointSlice; so it
// publishes each selector Service's Pods in one slice of address type FQDN
// whose addresses are those IPs written as names. What reads slices to
// dial them — the aggregator with --enable-aggregator-routing, its
// availability check — takes the first address as a host, which an IP
// literal is. A Pod is a ready endpoint while its Ready condition is true.
type endpointSlices struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// startEndpointSlices starts publishing; stop ends it.
func startEndpointSlices(cfg *rest.Config) (*endpointSlices, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactory(cs, 0)
	services, pods := f.Core().V1().Services(), f.Core().V1().Pods()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName]())
	enqueueService := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if s, ok := obj.(*corev1.Service); ok {
			q.Add(cache.ObjectName{Namespace: s.Namespace, Name: s.Name})
		}
	}
	// A Pod's change touches the Services of its namespace that select it.
	enqueuePod := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		list, _ := services.Lister().Services(p.Namespace).List(labels.Everything())
		for _, s := range list {
			if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(p.Labels)) {
				q.Add(cache.ObjectName{Namespace: s.Namespace, Name: s.Name})
			}
		}
	}
	if _, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueService, UpdateFunc: func(_, o any) { enqueueService(o) }, DeleteFunc: enqueueService,
	}); err != nil {
		cancel()
		return nil, err
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueuePod, UpdateFunc: func(old, o any) { enqueuePod(old); enqueuePod(o) }, DeleteFunc: enqueuePod,
	}); err != nil {
		cancel()
		return nil, err
	}
	e := &endpointSlices{cancel: cancel}
	f.Start(ctx.Done())
	e.done.Go(func() {
		<-ctx.Done()
		q.ShutDown()
		f.Shutdown()
	})
	e.done.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), services.Informer().HasSynced, pods.Informer().HasSynced) {
			return
		}
		for {
			key, shutdown := q.Get()
			if shutdown {
				return
			}
			err := publish(ctx, cs, services.Lister().Services(key.Namespace), pods.Lister().Pods(key.Namespace), key)
			if err != nil && ctx.Err() == nil {
				q.AddRateLimited(key)
			} else {
				q.Forget(key)
			}
			q.Done(key)
		}
	})
	return e, nil
}

// stop ends the publishing and waits for it.
func (e *endpointSlices) stop() {
	e.cancel()
	e.done.Wait()
}

// publish writes (server-side apply) the slice of Service key as its
// Pods are now; a Service gone takes its slice with it (owner
// reference), one without a selector gets none.
func publish(ctx context.Context, cs kubernetes.Interface, services interface {
	Get(string) (*corev1.Service, error)
}, pods interface {
	List(labels.Selector) ([]*corev1.Pod, error)
}, key cache.ObjectName) error {
	svc, err := services.Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(svc.Spec.Selector) == 0 || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	selected, err := pods.List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return err
	}
	slice := discoveryac.EndpointSlice(svc.Name+"-kubetest", svc.Namespace).
		WithLabels(map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: endpointSliceManager}).
		WithOwnerReferences(metaac.OwnerReference().WithAPIVersion("v1").WithKind("Service").
			WithName(svc.Name).WithUID(svc.UID).WithController(true)).
		WithAddressType(discoveryv1.AddressTypeFQDN)
	var first *corev1.Pod
	for _, p := range selected {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if first == nil {
			first = p
		}
		ready := podReady(p)
		ep := discoveryac.Endpoint().WithAddresses(p.Status.PodIP).
			WithConditions(discoveryac.EndpointConditions().WithReady(ready).WithServing(ready).WithTerminating(false)).
			WithTargetRef(coreac.ObjectReference().WithKind("Pod").WithNamespace(p.Namespace).WithName(p.Name).WithUID(p.UID))
		if p.Spec.NodeName != "" {
			ep = ep.WithNodeName(p.Spec.NodeName)
		}
		slice = slice.WithEndpoints(ep)
	}
	for _, sp := range svc.Spec.Ports {
		port := targetPort(sp, first)
		if port == 0 {
			continue
		}
		slice = slice.WithPorts(discoveryac.EndpointPort().WithName(sp.Name).WithPort(port).WithProtocol(sp.Protocol))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = cs.DiscoveryV1().EndpointSlices(svc.Namespace).Apply(ctx, slice, metav1.ApplyOptions{FieldManager: endpointSliceManager, Force: true})
	if err != nil {
		return fmt.Errorf("endpoint slice of service %s: %w", key, err)
	}
	return nil
}

// targetPort is a Service port's port on its Pods: a number, or a named
// container port of pod (0 when it has none of that name).
func targetPort(sp corev1.ServicePort, pod *corev1.Pod) int32 {
	switch {
	case sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal != 0:
		return sp.TargetPort.IntVal
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		if pod == nil {
			return 0
		}
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal {
					return cp.ContainerPort
				}
			}
		}
		return 0
	default:
		return sp.Port
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
