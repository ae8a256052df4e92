package kube_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/store/storetest"
)

// BenchmarkRunLifecycle is a task Run's writes as the control plane makes
// them, a create and three status writes (scheduled, running, succeeded),
// through the kube store and through plain client-go calls of the same
// kind, so that the difference is what the store adds. The API server and
// etcd run on the same machine and dominate ns/op; cpu-ns/op is this
// process's CPU per lifecycle (client side only), cluster-cpu-ns/op that
// of etcd and the API server.
func BenchmarkRunLifecycle(b *testing.B) {
	c := startCluster(b)
	ctx := context.Background()
	phases := []v1alpha1.Phase{v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded}

	// Warm the API server up (its CRD handler, CEL programs, watch cache)
	// so that the first sub-benchmark does not pay for it.
	warm := open(b, c.Config, kube.Options{})
	for range 50 {
		if err := storetest.Lifecycle(ctx, warm.Runs(), storetest.BenchRun("warm-")); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("Store", func(b *testing.B) {
		s := open(b, c.Config, kube.Options{})
		defer storetest.CPUPerOp(b)()
		defer clusterCPUPerOp(b, c)()
		for b.Loop() {
			if err := storetest.Lifecycle(ctx, s.Runs(), storetest.BenchRun("store-")); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("RESTClient", func(b *testing.B) {
		// What a typed client-go clientset does: a REST client with the
		// types' scheme, JSON, the same rate limits as the store.
		scheme := runtime.NewScheme()
		if err := v1alpha1.AddToScheme(scheme); err != nil {
			b.Fatal(err)
		}
		cfg := rest.CopyConfig(c.Config)
		cfg.APIPath = "/apis"
		cfg.GroupVersion = &v1alpha1.SchemeGroupVersion
		cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
		cfg.QPS, cfg.Burst = kube.DefaultQPS, kube.DefaultBurst
		rc, err := rest.RESTClientFor(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer storetest.CPUPerOp(b)()
		defer clusterCPUPerOp(b, c)()
		for b.Loop() {
			r := &v1alpha1.Run{}
			if err := rc.Post().Namespace("default").Resource("runs").Body(storetest.BenchRun("rest-")).Do(ctx).Into(r); err != nil {
				b.Fatal(err)
			}
			for _, p := range phases {
				r.Status.Phase = p
				out := &v1alpha1.Run{}
				if err := rc.Put().Namespace("default").Resource("runs").Name(r.Name).SubResource("status").Body(r).Do(ctx).Into(out); err != nil {
					b.Fatal(err)
				}
				r = out
			}
		}
	})

	b.Run("Dynamic", func(b *testing.B) {
		cfg := rest.CopyConfig(c.Config)
		cfg.QPS, cfg.Burst = kube.DefaultQPS, kube.DefaultBurst
		dc, err := dynamic.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		runs := dc.Resource(v1alpha1.SchemeGroupVersion.WithResource("runs")).Namespace("default")
		defer storetest.CPUPerOp(b)()
		defer clusterCPUPerOp(b, c)()
		for b.Loop() {
			in := storetest.BenchRun("dynamic-")
			in.SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind(v1alpha1.KindRun))
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(in)
			if err != nil {
				b.Fatal(err)
			}
			u, err := runs.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			for _, p := range phases {
				if err := unstructured.SetNestedField(u.Object, string(p), "status", "phase"); err != nil {
					b.Fatal(err)
				}
				if u, err = runs.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})

	// The store from 32 goroutines at once (the create
	// concurrency), as lifecycles per second: what one store's client gets
	// through the API server and etcd on this machine, before any
	// controller work.
	b.Run("StoreParallel32", func(b *testing.B) {
		s := open(b, c.Config, kube.Options{})
		b.SetParallelism(16) // × GOMAXPROCS 2
		defer storetest.CPUPerOp(b)()
		defer clusterCPUPerOp(b, c)()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := storetest.Lifecycle(ctx, s.Runs(), storetest.BenchRun("parallel-")); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "lifecycles/s")
	})
}

// clusterCPUPerOp starts measuring the CPU time of the cluster's processes
// (etcd and kube-apiserver); the function it returns reports it per
// operation, which is where a write's cost mostly goes. Use: defer
// clusterCPUPerOp(b, c)().
func clusterCPUPerOp(b *testing.B, c *kubetest.Cluster) func() {
	start := c.CPUTime(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(c.CPUTime(b)-start)/float64(b.N), "cluster-cpu-ns/op")
		}
	}
}
