// Package kubetest runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver, and on request kube-controller-manager and kube-scheduler,
// as child processes built from the versions pinned in tools/kube/go.mod
// (testdeps.KubeDir). No kubelet runs; internal/kubetest/nodeagent stands in
// for it. Every socket is on 127.0.0.1 and authenticated: etcd and the API
// server serve TLS and require client certificates (the API server also
// takes service-account tokens; anonymous requests are refused), and the
// controller-manager and scheduler serve nothing. The aggregation layer is
// on (a front-proxy CA and client certificate), and a stand-in publishes
// the Services' EndpointSlices, so an APIService reaches its Pods. The cluster's data,
// certificates, kubeconfigs and logs live in one private directory, and
// nothing it started outlives it.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"stoke.dev/stoke/internal/testdeps"
)

// Options says which components run besides etcd and the API server.
type Options struct {
	// ControllerManager runs kube-controller-manager with the controllers
	// of Controllers; the API server then admits Pods through the
	// ServiceAccount admission plugin, as a real cluster does.
	ControllerManager bool
	// Scheduler runs kube-scheduler.
	Scheduler bool
	// Profiling serves the API server's /debug/pprof on its own port to
	// the admin (off otherwise): the benchmarks' CPU profiles.
	Profiling bool
}

// Controllers are the kube-controller-manager controllers the cluster runs:
// what Deployments, owner references, namespaces, ServiceAccounts and their
// tokens need. Node lifecycle, Jobs and the rest do not run; neither do the
// endpoints and EndpointSlice controllers, whose addresses the API server
// refuses for the node agent's loopback Pod IPs: endpointSlices stands in
// for them.
var Controllers = []string{
	"deployment-controller",
	"replicaset-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"pod-garbage-collector-controller",
}

// FrontProxyClientName is the common name of the API server's front-proxy
// client certificate (--requestheader-allowed-names).
const FrontProxyClientName = "front-proxy-client"

// Bounds on waiting for the cluster.
const (
	readyBound    = 2 * time.Minute  // from starting the API server to /readyz answering ok
	apiserverStop = 10 * time.Second // SIGTERM to SIGKILL when a test stops the API server
)

// Cluster is a running test cluster.
type Cluster struct {
	// Config is an admin's (group system:masters) client configuration,
	// without client-side throttling to speak of (QPS 1000). Shared by
	// every user of the cluster: copy it (rest.CopyConfig) to change it.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file holding Config.
	Kubeconfig string
	// Dir is the cluster's private directory: pki/, etcd/, kubeconfigs,
	// and a log file per component.
	Dir string
	// BinDir holds the programs (testdeps.KubeDir).
	BinDir string

	etcd, apiserver, controllerManager, scheduler *component
	// clientCA signs the certificates the API server authenticates
	// (--client-ca-file).
	clientCA *ca
	// slices publishes the Services' EndpointSlices.
	slices *endpointSlices
	// etcdClient is how the API server reaches etcd: its URL, CA and the
	// client certificate and key.
	etcdClient struct{ url, ca, cert, key string }
}

// start starts a cluster in dir, an empty private directory. On error,
// whatever it started is stopped again and the error carries the logs.
func start(opts Options, dir string) (_ *Cluster, err error) {
	bin, err := testdeps.KubeDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, BinDir: bin}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, c.logTails(40))
			_ = c.stop()
		}
	}()
	if err := c.configure(opts); err != nil {
		return nil, err
	}
	if err := c.etcd.start(); err != nil {
		return nil, err
	}
	// The API server waits for etcd by itself.
	if err := c.startAPIServer(); err != nil {
		return nil, err
	}
	// CRDs before the controller-manager: its garbage collector learns the
	// resources at start (and again only every 30 s), and cannot collect
	// the dependents of an owner whose kind it does not know.
	if err := c.installCRDs(); err != nil {
		return nil, err
	}
	for _, comp := range []*component{c.controllerManager, c.scheduler} {
		if comp == nil {
			continue
		}
		if err := comp.start(); err != nil {
			return nil, err
		}
	}
	if c.slices, err = startEndpointSlices(c.Config); err != nil {
		return nil, err
	}
	if c.controllerManager != nil {
		// Pods are admitted only once their namespace's default
		// ServiceAccount exists; the controller-manager makes it.
		if err := c.waitForDefaultServiceAccount(metav1.NamespaceDefault); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// configure writes the cluster's certificates, keys and kubeconfigs and
// prepares each component's command line.
func (c *Cluster) configure(opts Options) error {
	pki := filepath.Join(c.Dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return err
	}
	clusterCA, err := newCA("stoke-kubetest-ca")
	if err != nil {
		return err
	}
	c.clientCA = clusterCA
	etcdCA, err := newCA("stoke-kubetest-etcd-ca")
	if err != nil {
		return err
	}
	caFile := filepath.Join(pki, "ca.crt")
	etcdCAFile := filepath.Join(pki, "etcd-ca.crt")
	// The aggregation layer's own trust domain, as kubeadm keeps it: the
	// API server proxies to an aggregated API with a client certificate
	// of the front-proxy CA, and the aggregated server trusts the
	// identity headers of that certificate only.
	frontProxyCA, err := newCA("stoke-kubetest-front-proxy-ca")
	if err != nil {
		return err
	}
	frontProxyCAFile := filepath.Join(pki, "front-proxy-ca.crt")
	for f, b := range map[string][]byte{caFile: clusterCA.pem, etcdCAFile: etcdCA.pem, frontProxyCAFile: frontProxyCA.pem} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return err
		}
	}
	files := map[string][2]string{} // name → cert, key
	for _, kp := range []struct {
		name, cn string
		orgs     []string
		server   bool
		ca       *ca
	}{
		{"etcd", "etcd", nil, true, etcdCA},
		{"apiserver-etcd-client", "kube-apiserver-etcd-client", nil, false, etcdCA},
		{"apiserver", "kube-apiserver", nil, true, clusterCA},
		{"admin", "kubetest-admin", []string{"system:masters"}, false, clusterCA},
		// The controller-manager and the scheduler act with an admin's
		// rights: their RBAC roles are not what these tests are about.
		{"controller-manager", "system:kube-controller-manager", []string{"system:masters"}, false, clusterCA},
		{"scheduler", "system:kube-scheduler", []string{"system:masters"}, false, clusterCA},
		{"front-proxy-client", FrontProxyClientName, nil, false, frontProxyCA},
	} {
		pair, err := kp.ca.issue(kp.cn, kp.orgs, kp.server)
		if err != nil {
			return err
		}
		cert, key, err := pair.write(pki, kp.name)
		if err != nil {
			return err
		}
		files[kp.name] = [2]string{cert, key}
	}
	saKey, saPub, err := writeServiceAccountKey(pki)
	if err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "https://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "https://127.0.0.1:" + strconv.Itoa(ports[1])
	apiURL := "https://127.0.0.1:" + strconv.Itoa(ports[2])

	c.etcdClient.url, c.etcdClient.ca = etcdURL, etcdCAFile
	c.etcdClient.cert, c.etcdClient.key = files["apiserver-etcd-client"][0], files["apiserver-etcd-client"][1]
	c.etcd = &component{
		name: "etcd", path: filepath.Join(c.BinDir, "etcd"), logPath: filepath.Join(c.Dir, "etcd.log"),
		args: []string{
			"--name=kubetest", "--data-dir=" + filepath.Join(c.Dir, "etcd"),
			"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=kubetest=" + peerURL,
			"--client-cert-auth", "--trusted-ca-file=" + etcdCAFile,
			"--cert-file=" + files["etcd"][0], "--key-file=" + files["etcd"][1],
			"--peer-client-cert-auth", "--peer-trusted-ca-file=" + etcdCAFile,
			"--peer-cert-file=" + files["etcd"][0], "--peer-key-file=" + files["etcd"][1],
			// A test's data is thrown away with it.
			"--unsafe-no-fsync", "--log-level=warn",
		},
	}
	// The default admission plugins stay on, among them
	// ValidatingAdmissionPolicy, which deploy/'s runtimed policies need
	// (they read the pod-uid and pod-name extras of Pod-bound tokens).
	admission := "--disable-admission-plugins=ServiceAccount"
	if opts.ControllerManager {
		admission = "--enable-admission-plugins=NodeRestriction"
	}
	c.apiserver = &component{
		name: "kube-apiserver", path: filepath.Join(c.BinDir, "kube-apiserver"), logPath: filepath.Join(c.Dir, "kube-apiserver.log"),
		args: []string{
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[2]),
			// The endpoint reconciler refuses a loopback address; the
			// kubernetes Service has no endpoints, as there are no Pod networks.
			"--endpoint-reconciler-type=none",
			"--tls-cert-file=" + files["apiserver"][0], "--tls-private-key-file=" + files["apiserver"][1],
			"--client-ca-file=" + caFile, "--anonymous-auth=false",
			"--authorization-mode=Node,RBAC", admission,
			"--etcd-servers=" + etcdURL, "--etcd-cafile=" + etcdCAFile,
			"--etcd-certfile=" + files["apiserver-etcd-client"][0], "--etcd-keyfile=" + files["apiserver-etcd-client"][1],
			"--service-cluster-ip-range=10.0.0.0/24",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
			"--profiling=" + strconv.FormatBool(opts.Profiling),
			// The aggregation layer, as kubeadm configures it: the API
			// server authenticates and authorizes the caller of an
			// aggregated API, then proxies with the front-proxy client
			// certificate and the caller in X-Remote-* headers. It dials
			// a Service's endpoints itself (there is no kube-proxy).
			"--requestheader-client-ca-file=" + frontProxyCAFile,
			"--requestheader-allowed-names=" + FrontProxyClientName,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-uid-headers=X-Remote-Uid",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + files["front-proxy-client"][0],
			"--proxy-client-key-file=" + files["front-proxy-client"][1],
			"--enable-aggregator-routing=true",
		},
	}

	admin, err := c.writeKubeconfig("admin", apiURL, clusterCA.pem, files["admin"])
	if err != nil {
		return err
	}
	c.Kubeconfig = admin
	cfg, err := clientcmd.BuildConfigFromFlags("", admin)
	if err != nil {
		return err
	}
	// Tests are the only clients; client-side throttling only slows them.
	cfg.QPS, cfg.Burst = 1000, 2000
	c.Config = cfg

	if opts.ControllerManager {
		kc, err := c.writeKubeconfig("controller-manager", apiURL, clusterCA.pem, files["controller-manager"])
		if err != nil {
			return err
		}
		c.controllerManager = &component{
			name: "kube-controller-manager", path: filepath.Join(c.BinDir, "kube-controller-manager"),
			logPath: filepath.Join(c.Dir, "kube-controller-manager.log"),
			args: []string{
				"--kubeconfig=" + kc, "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
				"--controllers=" + strings.Join(Controllers, ","),
				"--service-account-private-key-file=" + saKey, "--root-ca-file=" + caFile,
				"--use-service-account-credentials=false",
			},
		}
	}
	if opts.Scheduler {
		kc, err := c.writeKubeconfig("scheduler", apiURL, clusterCA.pem, files["scheduler"])
		if err != nil {
			return err
		}
		c.scheduler = &component{
			name: "kube-scheduler", path: filepath.Join(c.BinDir, "kube-scheduler"),
			logPath: filepath.Join(c.Dir, "kube-scheduler.log"),
			args:    []string{"--kubeconfig=" + kc, "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"},
		}
	}
	return nil
}

// writeKubeconfig writes Dir/name.kubeconfig for a client certificate.
func (c *Cluster) writeKubeconfig(name, server string, caPEM []byte, certKey [2]string) (string, error) {
	cert, err := os.ReadFile(certKey[0])
	if err != nil {
		return "", err
	}
	key, err := os.ReadFile(certKey[1])
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: name}
	kc.CurrentContext = "kubetest"
	path := filepath.Join(c.Dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o600)
}

// startAPIServer starts the API server (again) with the same port, etcd
// and certificates, and returns once its /readyz answers ok.
func (c *Cluster) startAPIServer() error {
	if err := c.apiserver.start(); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyBound)
	defer cancel()
	// Polled: a process becoming ready has no event to await.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Raw()
		if err == nil && string(body) == "ok" {
			return nil
		}
		select {
		case <-c.apiserver.exited():
			return fmt.Errorf("kube-apiserver exited before it was ready: %w", c.apiserver.p.Err())
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready within %v: %v", readyBound, err)
		case <-tick.C:
		}
	}
}

// stopAPIServer stops the API server (SIGTERM, SIGKILL after 10 s);
// etcd and the other components keep running.
func (c *Cluster) stopAPIServer() {
	c.apiserver.stop(apiserverStop)
}

var setCtrlLogger sync.Once

// installCRDs installs every deploy/crds/*.yaml of Stoke's module (none
// while the directory does not exist) and waits until the API server
// serves them.
func (c *Cluster) installCRDs() error {
	root, err := testdeps.ModuleRoot()
	if err != nil {
		return err
	}
	// envtest logs through controller-runtime's global logger, which
	// prints a warning with a stack trace until one is set.
	setCtrlLogger.Do(func() { ctrllog.SetLogger(logr.Discard()) })
	_, err = envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{
		Paths:   []string{filepath.Join(root, "deploy", "crds")},
		MaxTime: readyBound,
	})
	if err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	return nil
}

// waitForDefaultServiceAccount waits for the controller-manager to create
// namespace ns's default ServiceAccount.
func (c *Cluster) waitForDefaultServiceAccount(ns string) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyBound)
	defer cancel()
	go func() { // no use waiting for a dead controller-manager
		select {
		case <-c.controllerManager.exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "serviceaccounts", ns,
		func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=default" })
	_, err = watchtools.UntilWithSync(ctx, lw, &corev1.ServiceAccount{}, nil,
		func(ev watch.Event) (bool, error) { return ev.Type != watch.Deleted, nil })
	if err != nil {
		if err := c.controllerManager.died(); err != nil {
			return err
		}
		return fmt.Errorf("the default ServiceAccount of namespace %s: %w", ns, err)
	}
	return nil
}

// createNamespace creates a namespace named test-<random> and, when the
// controller-manager runs, waits for its default ServiceAccount.
func (c *Cluster) createNamespace() (string, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return "", err
	}
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	if c.controllerManager != nil {
		if err := c.waitForDefaultServiceAccount(ns.Name); err != nil {
			return "", err
		}
	}
	return ns.Name, nil
}

// deleteNamespace starts deleting namespace ns; the namespace controller
// (if it runs) finishes the job in the background.
func (c *Cluster) deleteNamespace(ns string) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	err = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", ns, err)
	}
	return nil
}

// stop kills every component (at once: the data goes with the test) and
// reports any that had exited by itself.
func (c *Cluster) stop() error {
	var errs []error
	if c.slices != nil {
		c.slices.stop()
	}
	for _, comp := range []*component{c.scheduler, c.controllerManager, c.apiserver, c.etcd} {
		if comp == nil {
			continue
		}
		errs = append(errs, comp.died())
		comp.stop(0)
	}
	return errors.Join(errs...)
}

// logTails is the end of every component's log, for a failure message.
func (c *Cluster) logTails(n int) string {
	var b strings.Builder
	for _, comp := range []*component{c.etcd, c.apiserver, c.controllerManager, c.scheduler} {
		if comp == nil || comp.p == nil {
			continue
		}
		fmt.Fprintf(&b, "\n--- the last %d lines of %s:\n%s", n, comp.logPath, comp.logTail(n))
	}
	return b.String()
}

// freePorts returns n distinct ports free on 127.0.0.1 just now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Pids are the process IDs of the cluster's components as last started.
func (c *Cluster) Pids() []int {
	var pids []int
	for _, comp := range []*component{c.etcd, c.apiserver, c.controllerManager, c.scheduler} {
		if comp != nil && comp.p != nil {
			pids = append(pids, comp.p.Pid())
		}
	}
	return pids
}

// CPU is the user and system CPU time the cluster's components, as last
// started, have used so far (from /proc, in the kernel's 10 ms ticks):
// benchmarks divide its growth by their operations to say what each cost
// the API server and etcd.
func (c *Cluster) CPU() (time.Duration, error) {
	var total time.Duration
	for _, pid := range c.Pids() {
		p, err := procfs.NewProc(pid)
		if err != nil {
			return 0, fmt.Errorf("cluster CPU: %w", err)
		}
		st, err := p.Stat()
		if err != nil {
			return 0, fmt.Errorf("cluster CPU of process %d: %w", pid, err)
		}
		total += time.Duration(st.CPUTime() * float64(time.Second))
	}
	return total, nil
}
