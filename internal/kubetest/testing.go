package kubetest

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Start starts a cluster for t in a directory of t's and stops it when t
// ends, printing the end of each component's log if t failed or a
// component exited by itself.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	began := time.Now()
	c, err := start(opts, t.TempDir())
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Logf("kubetest: cluster up in %v (API server %s, logs in %s)", time.Since(began).Round(time.Millisecond), c.Config.Host, c.Dir)
	t.Cleanup(func() {
		if err := c.stop(); err != nil {
			t.Errorf("kubetest: %v", err)
		}
		if t.Failed() {
			t.Logf("kubetest: the cluster's logs:%s", c.logTails(60))
		}
	})
	return c
}

// Kubectl runs kubectl against the cluster as its admin and returns its
// standard output; it fails t when kubectl fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	// Its discovery cache stays with the cluster, not in ~/.kube.
	cmd := exec.Command(filepath.Join(c.BinDir, "kubectl"),
		append([]string{"--kubeconfig", c.Kubeconfig, "--cache-dir", filepath.Join(c.Dir, "kubectl-cache")}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// StopAPIServer stops the API server (SIGTERM, SIGKILL after 10 s); etcd
// and the other components keep running, and clients see connections
// refused until StartAPIServer.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	c.stopAPIServer()
}

// StartAPIServer starts the API server stopped by StopAPIServer again, on
// the same port with the same etcd and certificates, so that clients
// reconnect by themselves; it returns once the API server is ready.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	if err := c.startAPIServer(); err != nil {
		t.Fatalf("kubetest: %v%s", err, c.logTails(40))
	}
}

// Namespace creates a namespace of t's own (deleted when t ends) and, when
// the controller-manager runs, waits for its default ServiceAccount, which
// Pods need to be admitted.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	name, err := c.createNamespace()
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if err := c.deleteNamespace(name); err != nil {
			t.Errorf("kubetest: %v", err)
		}
	})
	return name
}

// CPUTime is CPU, failing tb when /proc cannot be read: the CPU time the
// cluster's own processes used so far.
func (c *Cluster) CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	d, err := c.CPU()
	if err != nil {
		tb.Fatalf("kubetest: %v", err)
	}
	return d
}
