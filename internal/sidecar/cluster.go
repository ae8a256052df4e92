package sidecar

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"stoke.dev/stoke/internal/kubeconfig"
	"stoke.dev/stoke/internal/store/kube"
)

// RunInCluster connects to the API server — with the kubeconfig file when
// one is named, else with the Pod's service account (in-cluster config) —
// and runs runtimed there: the Kubernetes store's Runs and the Pod
// namespace's Leases. cfg.Runs and cfg.Leases are set here.
func RunInCluster(ctx context.Context, kubeconfigPath string, cfg Config) error {
	rc, err := kubeconfig.Load(kubeconfigPath)
	if err != nil {
		return err
	}
	rc.UserAgent = "stoke-runtimed/" + cfg.Pod.Name
	st, err := kube.New(rc, kube.Options{Logger: cfg.Logger, UserAgent: rc.UserAgent})
	if err != nil {
		return err
	}
	defer st.Close()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	cfg.Runs = st.Runs()
	cfg.Leases = cs.CoordinationV1().Leases(cfg.Pod.Namespace)
	return Run(ctx, cfg)
}
