// Package kubeconfig finds the API server: for Stoke's Kubernetes roles
// (`stoke controller`, `stoke runtimed`) the kubeconfig file named by
// their --kubeconfig flag, else the Pod's service account (in-cluster
// config); for the stoke CLI, a kubeconfig context found as kubectl finds
// it (client-go's loading rules: --kubeconfig, else KUBECONFIG, else
// ~/.kube/config; --context, else the current context; exec credential
// plugins and auth providers included).
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

// Options are a client command's kubectl flags; an empty field is unset.
type Options struct {
	// Kubeconfig is --kubeconfig: this file alone, instead of KUBECONFIG's
	// list or ~/.kube/config.
	Kubeconfig string
	// Context is --context: this context instead of the current one.
	Context string
	// Namespace is -n: this namespace instead of the context's.
	Namespace string
}

// Client is a kubeconfig context, resolved.
type Client struct {
	REST *rest.Config
	// Context is the context's name.
	Context string
	// Namespace is -n, else the context's namespace, else "default".
	Namespace string
}

// LoadClient resolves o as kubectl does. KUBECONFIG is read from the
// process's environment, by client-go.
func LoadClient(o Options) (*Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.Context}
	overrides.Context.Namespace = o.Namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	name := o.Context
	if name == "" {
		name = raw.CurrentContext
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig context %q: %w", name, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig context %q: %w", name, err)
	}
	return &Client{REST: rc, Context: name, Namespace: ns}, nil
}
