package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/client/cluster"
	"stoke.dev/stoke/internal/client/connect"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/kubetest"
)

// The cluster backend against a real API server (with Stoke's CRDs and
// no controller: nothing acts on the Runs): a kubeconfig context chosen
// as kubectl would, with its namespace and an exec credential plugin;
// Runs and Runtimes through the API server with the standalone watch
// semantics; invoke and exec through the API server to the gateway's
// aggregated API.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	ns := c.Namespace(t)

	// A user whose kubeconfig gets its token from an exec credential
	// plugin (a ServiceAccount bound to cluster-admin: the plugin prints
	// its token), with the context's namespace set.
	c.Kubectl(t, "create", "serviceaccount", "cli-user", "-n", ns)
	c.Kubectl(t, "create", "clusterrolebinding", "cli-user-"+ns, "--clusterrole=cluster-admin", "--serviceaccount="+ns+":cli-user")
	token := strings.TrimSpace(c.Kubectl(t, "create", "token", "cli-user", "-n", ns, "--duration=1h"))
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(dir, "plugin.sh")
	script := "#!/bin/sh\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' \"$(cat " + tokenFile + ")\"\n"
	if err := os.WriteFile(plugin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos["plugged"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: plugin, InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}}
	kc.Contexts["team"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "plugged", Namespace: ns}
	kc.CurrentContext = "team"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	conn, err := connect.Open(connect.Flags{Kubeconfig: kubeconfig}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tg := conn.Target(); conn.Namespace != ns || tg.Mode != client.Cluster || tg.Context != "team" || tg.Why != "--kubeconfig" ||
		tg.Gateway != c.Config.Host+cluster.AggregatedPath {
		t.Fatalf("opened namespace %q, target %+v", conn.Namespace, tg)
	}
	ctx := t.Context()

	task := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "task-", Namespace: ns, Labels: map[string]string{"batch": "a"}},
		Spec:       v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}},
	}
	if _, err := conn.CreateRun(ctx, task); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `no Runtime "bash"`) {
		t.Fatalf("a Run of a Runtime that does not exist: %v", err)
	}
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "bash", Namespace: ns}, Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 2}}
	if _, err := conn.ApplyRuntime(ctx, rt); err != nil {
		t.Fatal(err)
	}
	rt.Spec.Replicas = 2
	if got, err := conn.ApplyRuntime(ctx, rt); err != nil || got.Spec.Replicas != 2 {
		t.Fatalf("apply of a changed Runtime: %v, %+v", err, got)
	}
	created, err := conn.CreateRun(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.Name, "task-") || created.UID == "" {
		t.Fatalf("created %+v", created.ObjectMeta)
	}

	// A watch from nothing starts with what exists (as stoke up's does),
	// then a cancel is MODIFIED and a delete DELETED.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w, err := conn.WatchRuns(wctx, ns, client.ListOptions{LabelSelector: "batch=a"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	next := func(want client.EventType) *v1alpha1.Run {
		t.Helper()
		ev, err := w.Next()
		if err != nil || ev.Type != want || ev.Object.Name != created.Name {
			t.Fatalf("watch: %v %v, want %s of %s", ev.Type, err, want, created.Name)
		}
		return ev.Object
	}
	next(client.Added)
	if _, err := conn.CancelRun(ctx, ns, created.Name); err != nil {
		t.Fatal(err)
	}
	if r := next(client.Modified); !r.Spec.CancelRequested {
		t.Errorf("cancelled Run %+v", r.Spec)
	}
	list, err := conn.ListRuns(ctx, ns, client.ListOptions{LabelSelector: "batch=a"})
	if err != nil || len(list.Items) != 1 || list.Kind != "RunList" {
		t.Fatalf("list: %v, %+v", err, list)
	}
	if none, err := conn.ListRuns(ctx, "", client.ListOptions{LabelSelector: "batch=none"}); err != nil || len(none.Items) != 0 {
		t.Fatalf("list of every namespace: %v, %d items", err, len(none.Items))
	}
	if gone, err := conn.DeleteRun(ctx, ns, created.Name); err != nil || gone.UID != created.UID {
		t.Fatalf("delete: %v", err)
	}
	next(client.Deleted)
	if _, err := conn.GetRun(ctx, ns, created.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}

	// Invoke and exec go to the gateway's aggregated API through the API
	// server, authenticated by the plugin's token: here no gateway is
	// installed, which the API server answers (a refused credential
	// would be 401 or 403).
	_, err = conn.Invoke(ctx, ns, "fn", "uid-1", []byte(`{}`), client.InvokeOptions{})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(err.Error(), cluster.AggregatedPath+"/namespaces/"+ns+"/runs/fn/invoke/uid-1") {
		t.Errorf("invoke without a gateway: %v", err)
	}
	_, err = conn.Exec().Start(ctx, exec.Request{RunUID: ns + "/fn", Command: []string{"true"}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(err.Error(), cluster.AggregatedPath+"/namespaces/"+ns+"/runs/fn/exec") {
		t.Errorf("exec without a gateway: %v", err)
	}
	if _, err := conn.DeleteRuntime(ctx, ns, "bash"); err != nil {
		t.Fatal(err)
	}
}
