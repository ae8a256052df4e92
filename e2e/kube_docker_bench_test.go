package e2e

import (
	"os"
	"os/exec"
	"time"

	"testing"
)

// BenchmarkDockerOnCluster is `docker run --rm bash true` through the
// Kubernetes gateway's Docker port (Debian's CLI, TLS with a client
// certificate, through the test's port forward), the whole CLI process,
// beside `stoke run --rm --runtime bash -- true` on the same cluster
// through the admin's kubeconfig, alternating, in the same run. (Not
// named Kube…: a `-bench 'Kube/…'` pattern would start its cluster too.)
func BenchmarkDockerOnCluster(b *testing.B) {
	e := startKube(b)
	addr := e.dockerForward(b)
	e.bindUser(b, "bench-editor", "stoke-edit")
	certs := e.dockerCerts(b, "bench-editor", e.gatewayCA(b))
	bin := "/usr/bin/docker"
	if _, err := os.Stat(bin); err != nil {
		b.Fatal("no Debian Docker CLI at /usr/bin/docker (apt-get install docker.io)")
	}
	env := append(os.Environ(), "DOCKER_HOST=tcp://"+addr, "DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH="+certs,
		"DOCKER_CONFIG="+b.TempDir(), "KUBECONFIG="+e.cluster.Kubeconfig, "XDG_STATE_HOME="+b.TempDir())
	run := func(name string, args ...string) time.Duration {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return time.Since(t0)
	}
	docker := func() time.Duration { return run(bin, "run", "--rm", "bash", "true") }
	stoke := func() time.Duration { return run(stokeBin, "run", "--rm", "--runtime", "bash", "--", "true") }
	docker() // the connections, caches and pods warm
	stoke()
	var d, s []time.Duration
	for b.Loop() {
		d = append(d, docker())
		s = append(s, stoke())
	}
	reportPercentilesAs(b, d, "docker")
	reportPercentilesAs(b, s, "stoke")
}
