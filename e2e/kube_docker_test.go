package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/docker"
)

// dockerPort is the gateway's Docker port in the chart (gateway.docker.port).
const dockerPort = "2376"

// TestKubeDocker drives the Kubernetes gateway's Docker Engine API, as
// the chart installs it (gateway.docker.enabled), with Debian's Docker
// CLI (API 1.41) and the Go SDK at the newest API version, over TLS with
// DOCKER_TLS_VERIFY and client certificates of the cluster's client CA
// (kubeconfig users'): a stoke-edit user runs containers as task Runs,
// with logs, wait, exec (-i and -it, hijacked over TLS) and cp; a
// stoke-view user lists them and is refused the rest (403); a user bound
// to nothing, another namespace and a client without a certificate are
// refused (403, 403, 401), in Docker's error shape, and none of their
// requests made a Run. An image a Runtime's Pods run selects that Runtime.
func TestKubeDocker(t *testing.T) {
	e := startKube(t)
	addr := e.dockerForward(t)
	ca := e.gatewayCA(t)
	// Users by their certificates: the RoleBindings name them as the API
	// server would authenticate the same certificates.
	e.bindUser(t, "docker-editor", "stoke-edit")
	e.bindUser(t, "docker-viewer", "stoke-view")
	editor := e.dockerCerts(t, "docker-editor", ca)
	viewer := e.dockerCerts(t, "docker-viewer", ca)
	nobody := e.dockerCerts(t, "docker-nobody", ca)
	bin := dockerCLIs(t)[0]
	cli := func(t *testing.T, certs, path string) dockerCLI {
		return dockerCLI{t: t, bin: bin, host: "tcp://" + addr + path, env: []string{"DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + certs}}
	}
	runsBefore := e.runNames(t)

	t.Run("CLI", func(t *testing.T) {
		d := cli(t, editor, "")
		if out := d.ok("run", "--rm", "bash", "echo", "hello"); out != "hello\n" {
			t.Errorf("run --rm: stdout %q, want hello", out)
		}
		// The namespace in the host's path: the same as the default here.
		d = cli(t, editor, "/namespaces/"+runsNamespace)
		id := strings.TrimSpace(d.ok("run", "-d", "--name", "kd-logs", "bash", "sh", "-c", "for i in 0 1 2; do echo $i; done; exit 4"))
		if out := d.ok("logs", "-f", id); out != "0\n1\n2\n" {
			t.Errorf("logs -f: %q", out)
		}
		if out := d.ok("wait", id); out != "4\n" {
			t.Errorf("wait: %q, want 4", out)
		}
		if out := d.ok("inspect", "-f", "{{.State.ExitCode}} {{.State.Status}}", "kd-logs"); out != "4 exited\n" {
			t.Errorf("inspect: %q", out)
		}
		// The container is a task Run of the namespace.
		if run := e.getRun(t, "kd-logs"); run.Spec.Runtime != "bash" || run.Status.ExitCode == nil || *run.Status.ExitCode != 4 {
			t.Errorf("its Run: runtime %s, exit %v", run.Spec.Runtime, run.Status.ExitCode)
		}
		d.ok("rm", "kd-logs")

		id = strings.TrimSpace(d.ok("run", "-d", "--name", "kd-exec", "bash", "sh", "-c", "echo ready; exec sleep 600"))
		defer d.ok("rm", "-f", id)
		d.awaitLogLine(id, "ready")
		out, _, code := d.run("one\ntwo\n", "exec", "-i", id, "sh", "-c", "cat; echo done")
		if out != "one\ntwo\ndone\n" || code != 0 {
			t.Errorf("exec -i: %q exit %d", out, code)
		}
		testExecTTY(t, d, id)
		testCopy(t, d, id)
		if out := d.ok("ps", "--filter", "name=kd-exec", "--format", "{{.Names}}"); out != "kd-exec\n" {
			t.Errorf("ps: %q", out)
		}
	})

	// The main process's stdin and terminal through the gateway and
	// runtimed's hop: run -i, run -it with a resize, run -d -it + attach.
	t.Run("Interactive", func(t *testing.T) {
		testRunInteractive(t, cli(t, editor, ""), "kd")
	})

	t.Run("SDK", func(t *testing.T) {
		c, err := client.New(client.WithHost("tcp://"+addr+"/namespaces/"+runsNamespace), client.WithAPIVersion(docker.APIVersion),
			client.WithTLSClientConfig(filepath.Join(editor, "ca.pem"), filepath.Join(editor, "cert.pem"), filepath.Join(editor, "key.pem")))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		created, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "kd-sdk", Config: &container.Config{
			Image: "bash", Cmd: []string{"sh", "-c", "echo ready; exec sleep 600"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = c.ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
		}()
		if _, err := c.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
			t.Fatal(err)
		}
		ex, err := c.ExecCreate(ctx, created.ID, client.ExecCreateOptions{Cmd: []string{"sh", "-c", "cat; echo bye >&2; exit 5"}, AttachStdin: true, AttachStdout: true, AttachStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		att, err := c.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := att.Conn.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if err := att.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if _, err := stdcopy.StdCopy(&out, &errOut, att.Reader); err != nil {
			t.Fatal(err)
		}
		att.Close()
		if out.String() != "ping\n" || errOut.String() != "bye\n" {
			t.Errorf("exec: stdout %q stderr %q", out.String(), errOut.String())
		}
		ins, err := c.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
		if err != nil || ins.ExitCode != 5 {
			t.Errorf("exec inspect: %+v %v, want exit 5", ins, err)
		}
		t.Run("Attach", func(t *testing.T) { testSDKAttach(t, ctx, c) })
		t.Run("Detach", func(t *testing.T) { testSDKDetach(t, ctx, c) })
	})

	// A created container is its Run, held: the other replica starts,
	// lists, inspects and removes it.
	t.Run("CreatedAcrossReplicas", func(t *testing.T) {
		urls := gatewayBases(e.gateways(t, 2))
		if len(urls) < 2 {
			t.Fatalf("gateways %v, want two", urls)
		}
		one := dockerCLI{t: t, bin: bin, host: "tcp://" + dockerForwardTo(t, urls[0]), env: []string{"DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + editor}}
		other := one
		other.host = "tcp://" + dockerForwardTo(t, urls[1])
		id := strings.TrimSpace(one.ok("create", "--name", "kd-held", "bash", "sh", "-c", "echo held-ran"))
		rmID := strings.TrimSpace(one.ok("create", "--name", "kd-held-rm", "bash", "true"))
		if run := e.getRun(t, "kd-held"); !run.Spec.Held || run.Status.AssignedPod != "" {
			t.Fatalf("the created container's Run: held %v, pod %q", run.Spec.Held, run.Status.AssignedPod)
		}
		// At once, by the ID create answered: the other replica reads the
		// store for a container not in its memory yet.
		other.ok("start", id)
		if out := other.ok("wait", id); out != "0\n" {
			t.Errorf("wait through the other replica: %q", out)
		}
		if out := other.ok("logs", id); out != "held-ran\n" {
			t.Errorf("logs through the other replica: %q", out)
		}
		if out := other.ok("inspect", "-f", "{{.State.Status}}", rmID); out != "created\n" {
			t.Errorf("inspect through the other replica: %q", out)
		}
		// kd-held-rm was created before kd-held started: the other
		// replica, having seen kd-held end, holds it in memory too.
		if out := other.ok("ps", "-a", "--filter", "status=created", "--filter", "name=kd-held", "--format", "{{.Names}} {{.Status}}"); out != "kd-held-rm Created\n" {
			t.Errorf("ps -a --filter status=created through the other replica: %q", out)
		}
		other.ok("rm", rmID)
		if _, err := e.stoke.Get().Namespace(runsNamespace).Resource("runs").Name("kd-held-rm").DoRaw(context.Background()); !apierrors.IsNotFound(err) {
			t.Errorf("the removed container's Run: %v", err)
		}
		one.ok("rm", id)
	})

	t.Run("RuntimeImage", func(t *testing.T) {
		// A Runtime whose Pods run a user's image is what that image
		// selects: the image's own module is there.
		rt := &v1alpha1.Runtime{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
			ObjectMeta: metav1.ObjectMeta{Namespace: runsNamespace, Name: "python-user"},
			Spec:       v1alpha1.RuntimeSpec{Server: "python", Replicas: 1, Runs: 2, Template: &v1alpha1.RuntimeTemplate{Image: userImage}},
		}
		if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(context.Background()).Error(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = e.stoke.Delete().Namespace(runsNamespace).Resource("runtimes").Name(rt.Name).Do(context.Background()).Error()
		}()
		e.awaitRuntimesReady(t, installBound)
		d := cli(t, editor, "")
		out := d.ok("run", "--rm", "--name", "kd-image", userImage, "python3", "-c", "import stokeuserlib; print(stokeuserlib.ANSWER)")
		if out != "from the user's image\n" {
			t.Errorf("run --rm of %s: %q, want the image's module's answer", userImage, out)
		}
		if out := d.ok("image", "inspect", "-f", `{{index .Config.Labels "dev.stoke.runtime"}}`, userImage); out != "python-user\n" {
			t.Errorf("image inspect: Runtime %q, want python-user", out)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		ed := cli(t, editor, "")
		ed.ok("run", "-d", "--name", "kd-view", "bash", "sleep", "600")
		defer ed.ok("rm", "-f", "kd-view")
		for _, tc := range []struct {
			name, certs, path string
			args              []string
			want              string
		}{
			{"ViewerRuns", viewer, "", []string{"run", "--rm", "bash", "true"}, `cannot create resource "runs"`},
			{"ViewerRemoves", viewer, "", []string{"rm", "-f", "kd-view"}, `cannot delete resource "runs"`},
			{"ViewerExecs", viewer, "", []string{"exec", "kd-view", "true"}, `cannot create resource "runs/exec"`},
			{"NobodyLists", nobody, "", []string{"ps", "-a"}, `cannot list resource "runs"`},
			{"OtherNamespace", editor, "/namespaces/kube-system", []string{"ps", "-a"}, `cannot get resource "runs" in API group "stoke.dev" in the namespace "kube-system"`},
			// The CA alone: no client certificate, no token.
			{"NoCertificate", onlyCA(t, editor), "", []string{"ps", "-a"}, "no client certificate and no bearer token"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, errOut, code := cli(t, tc.certs, tc.path).run("", tc.args...)
				if code == 0 || !strings.Contains(errOut, tc.want) {
					t.Errorf("docker %s: exit %d, stderr %q; want a refusal with %q", strings.Join(tc.args, " "), code, errOut, tc.want)
				}
			})
		}
		// The viewer reads what the editor may.
		if out := cli(t, viewer, "").ok("ps", "--filter", "name=kd-view", "--format", "{{.Names}}"); out != "kd-view\n" {
			t.Errorf("viewer's ps: %q", out)
		}
	})

	// Only the editor's containers made Runs.
	for name := range e.runNames(t) {
		if !runsBefore[name] && !strings.HasPrefix(name, "kd-") && !strings.HasPrefix(name, "docker-") && name != "tty-kd" {
			t.Errorf("a Run %s was made, which no allowed request asked for", name)
		}
	}
}

// dockerForward forwards a port of 127.0.0.1 to a gateway Pod's Docker
// port, as `kubectl port-forward` would: the test cluster's Pods are on
// loopback addresses no certificate can name in advance, and the
// gateway's names 127.0.0.1 (gateway.tls.ipAddresses), which the Docker
// CLI verifies.
func (e *kubeEnv) dockerForward(t testing.TB) string {
	t.Helper()
	return dockerForwardTo(t, anyGateway(e.gateways(t, 1)))
}

// dockerForwardTo forwards a local port to the Docker port of the gateway
// whose base URL is u.
func dockerForwardTo(t testing.TB, u string) string {
	t.Helper()
	host, _, err := net.SplitHostPort(strings.TrimPrefix(u, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(host, dockerPort)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.(*net.TCPConn).CloseWrite()
			}
			wg.Go(func() { pipe(up, c) })
			wg.Go(func() { pipe(c, up) })
		}
	})
	return lis.Addr().String()
}

// gatewayCA is the CA of the gateway's serving certificate (the chart's
// gateway.tls.generate), which a Docker client verifies it with.
func (e *kubeEnv) gatewayCA(t testing.TB) []byte {
	t.Helper()
	s, err := e.kube.CoreV1().Secrets(stokeNamespace).Get(context.Background(), "stoke-gateway-serving", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data["ca.crt"]
}

// bindUser binds the ClusterRole role to the user in runsNamespace.
func (e *kubeEnv) bindUser(t testing.TB, user, role string) {
	t.Helper()
	if _, err := e.kube.RbacV1().RoleBindings(runsNamespace).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dockerCerts is a DOCKER_CERT_PATH for the user: a client certificate
// of the cluster's CA and the gateway's CA.
func (e *kubeEnv) dockerCerts(t testing.TB, user string, ca []byte) string {
	t.Helper()
	cert, key, err := e.cluster.IssueClientCert(user)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"ca.pem": ca, "cert.pem": cert, "key.pem": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// onlyCA is a DOCKER_CERT_PATH with certs' CA and no client certificate.
func onlyCA(t *testing.T, certs string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// getRun reads a Run of runsNamespace as the admin.
func (e *kubeEnv) getRun(t *testing.T, name string) *v1alpha1.Run {
	t.Helper()
	run := &v1alpha1.Run{}
	if err := e.stoke.Get().Namespace(runsNamespace).Resource("runs").Name(name).Do(context.Background()).Into(run); err != nil {
		t.Fatal(err)
	}
	return run
}

// runNames are the names of runsNamespace's Runs.
func (e *kubeEnv) runNames(t *testing.T) map[string]bool {
	t.Helper()
	list := &v1alpha1.RunList{}
	if err := e.stoke.Get().Namespace(runsNamespace).Resource("runs").Do(context.Background()).Into(list); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range list.Items {
		names[r.Name] = true
	}
	return names
}
