// Package kubeconfig finds the API server for Stoke's Kubernetes roles
// (`stoke controller`, `stoke runtimed`): the kubeconfig file named by
// their --kubeconfig flag, else the Pod's service account (in-cluster
// config).
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load returns the REST config of the kubeconfig file at path, or the
// in-cluster config when path is empty.
func Load(path string) (*rest.Config, error) {
	if path != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config (or pass --kubeconfig): %w", err)
	}
	return rc, nil
}
