// Package connect decides which backend a stoke client command talks to —
// a standalone `stoke up` or a Kubernetes cluster through a kubeconfig
// context — from its flags and environment, and opens it as a client.API.
//
// The rule, in order (the first that applies decides):
//
//  1. Flags. --server, --token or --data-dir: standalone. --kubeconfig,
//     --context or --gateway: the cluster. Flags of both kinds are an
//     error.
//  2. Stoke's environment. STOKE_SERVER, STOKE_TOKEN or STOKE_DATA_DIR set:
//     standalone.
//  3. KUBECONFIG set: the cluster of its current context, unless a local
//     `stoke up` token is found in the default data directory, which wins
//     (a laptop running stoke up stays standalone; pass --context to go to
//     the cluster).
//  4. Otherwise standalone, on this machine.
//
// --namespace and --ca-cert apply to both (--ca-cert is the standalone
// server's CA, or the --gateway's). Target.Why records which step
// decided, and `stoke version` prints it.
package connect

import (
	"errors"
	"io/fs"
	"strings"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/client/cluster"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/kubeconfig"
)

// EnvKubeconfig is kubectl's environment variable.
const EnvKubeconfig = "KUBECONFIG"

// Flags are a client command's flags; an empty field is unset.
type Flags struct {
	// Standalone.
	client.Settings
	// Cluster.
	Kubeconfig, Context, Gateway string
	// Namespace is -n; "" is the default: the kubeconfig context's
	// namespace on a cluster, else "default".
	Namespace string
}

// Conn is an opened backend.
type Conn struct {
	client.API
	// Namespace is the namespace the command works in.
	Namespace string
	close     func() error
}

// Close releases the backend.
func (c *Conn) Close() error {
	if c.close == nil {
		return nil
	}
	return c.close()
}

// Choose applies the rule above and returns the mode and why.
func Choose(f Flags, getenv func(string) string) (client.Mode, string, error) {
	var standalone, kube []string
	for _, fl := range []struct{ name, value string }{{"--server", f.Server}, {"--token", f.Token}, {"--data-dir", f.DataDir}} {
		if fl.value != "" {
			standalone = append(standalone, fl.name)
		}
	}
	for _, fl := range []struct{ name, value string }{{"--kubeconfig", f.Kubeconfig}, {"--context", f.Context}, {"--gateway", f.Gateway}} {
		if fl.value != "" {
			kube = append(kube, fl.name)
		}
	}
	switch {
	case len(standalone) > 0 && len(kube) > 0:
		return "", "", errdefs.InvalidArgument("flags", "%s name a standalone server and %s a cluster: give one kind",
			strings.Join(standalone, ", "), strings.Join(kube, ", "))
	case len(standalone) > 0:
		return client.Standalone, standalone[0], nil
	case len(kube) > 0:
		return client.Cluster, kube[0], nil
	}
	for _, env := range []string{client.EnvServer, client.EnvToken, client.EnvDataDir} {
		if getenv(env) != "" {
			return client.Standalone, env, nil
		}
	}
	if getenv(EnvKubeconfig) == "" {
		return client.Standalone, "the default (no --kubeconfig, --context or KUBECONFIG)", nil
	}
	if dir, err := datadir.Default(); err == nil {
		if _, err := datadir.ReadToken(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return client.Standalone, "a local stoke up's token in " + dir + ", which wins over KUBECONFIG (pass --context for the cluster)", nil
		}
	}
	return client.Cluster, "KUBECONFIG (and no local stoke up token)", nil
}

// Open opens the backend the rule chooses. getenv is os.Getenv outside
// tests; KUBECONFIG itself is read by client-go.
func Open(f Flags, getenv func(string) string) (*Conn, error) {
	mode, why, err := Choose(f, getenv)
	if err != nil {
		return nil, err
	}
	if mode == client.Standalone {
		cfg, err := client.Resolve(f.Settings, getenv)
		if err != nil {
			return nil, err
		}
		cfg.Why = why
		c, err := client.New(cfg)
		if err != nil {
			return nil, err
		}
		ns := f.Namespace
		if ns == "" {
			ns = client.DefaultNamespace
		}
		return &Conn{API: c, Namespace: ns}, nil
	}
	kc, err := kubeconfig.LoadClient(kubeconfig.Options{Kubeconfig: f.Kubeconfig, Context: f.Context, Namespace: f.Namespace})
	if err != nil {
		return nil, err
	}
	caFile := f.CACert
	if caFile == "" {
		caFile = getenv(client.EnvCACert)
	}
	c, err := cluster.New(cluster.Config{REST: kc.REST, Context: kc.Context, Gateway: f.Gateway, CACertFile: caFile, Why: why})
	if err != nil {
		return nil, err
	}
	return &Conn{API: c, Namespace: kc.Namespace, close: c.Close}, nil
}
