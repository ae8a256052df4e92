package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// gatewaySelector selects the gateway's Pods (deploy/controller/gateway.yaml).
const gatewaySelector = "app.kubernetes.io/name=stoke-gateway"

// gatewayCall bounds one call through the gateway in these tests: a call
// that takes longer hung.
const gatewayCall = time.Minute

// TestKubeGateway is `stoke gateway` as deploy/ installs it (two
// replicas), used with ServiceAccount tokens bound to deploy/'s stoke-edit
// and stoke-view: what each may do, that refusals never reach the Runtime
// Server, 64 concurrent invokes of one function, and a replica killed
// under load.
func TestKubeGateway(t *testing.T) {
	e := startKube(t)
	g := e.gatewayUsers(t)
	for _, st := range []struct {
		name string
		test func(*testing.T, *kubeEnv, *gatewayUsers)
	}{
		{"EditAndView", testGatewayEditAndView},
		{"ConcurrentInvokes", testGatewayConcurrentInvokes},
		{"ReplicaKilled", testGatewayReplicaKilled},
	} {
		t.Run(st.name, func(t *testing.T) { st.test(t, e, g) })
	}
}

// gatewayUsers are the tokens of ServiceAccounts of runsNamespace bound
// to stoke-edit and stoke-view, and a client of the gateway's Pods.
type gatewayUsers struct {
	editor, viewer string
	http           *http.Client
}

func (e *kubeEnv) gatewayUsers(t testing.TB) *gatewayUsers {
	t.Helper()
	token := func(name, role string) string {
		ctx := context.Background()
		if _, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.kube.RbacV1().RoleBindings(runsNamespace).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: runsNamespace}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	return &gatewayUsers{
		editor: token("gw-editor", "stoke-edit"), viewer: token("gw-viewer", "stoke-view"),
		// The gateway's certificate is self-signed (deploy/ gives none).
		http: &http.Client{Timeout: gatewayCall, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 64,
		}},
	}
}

// gateways waits until n gateway Pods are Ready and returns their base
// URLs by Pod name.
func (e *kubeEnv) gateways(t testing.TB, n int) map[string]string {
	t.Helper()
	pods := e.watchPods(t, stokeNamespace, gatewaySelector)
	defer pods.close()
	got := pods.until(t, installBound, fmt.Sprintf("%d gateway pods ready", n), func(m map[string]*corev1.Pod) bool {
		ready := 0
		for _, p := range m {
			if _, ok := podReady(p); ok && p.DeletionTimestamp == nil {
				ready++
			}
		}
		return ready >= n
	})
	urls := map[string]string{}
	for name, p := range got {
		if _, ok := podReady(p); ok && p.DeletionTimestamp == nil {
			urls[name] = "https://" + net.JoinHostPort(p.Status.PodIP, "8443")
		}
	}
	return urls
}

// gatewayBases are the gateways' base URLs, in order.
func gatewayBases(urls map[string]string) []string {
	return slices.Sorted(maps.Values(urls))
}

// anyGateway is one of the ready gateways' URLs.
func anyGateway(urls map[string]string) string {
	for _, u := range urls {
		return u
	}
	return ""
}

// gwResult is one answer of the gateway.
type gwResult struct {
	status int
	body   string
	err    error
	retry  string // the Retry-After header
}

func (r gwResult) String() string {
	return fmt.Sprintf("%d %s %v", r.status, strings.TrimSpace(r.body), r.err)
}

// call makes one request with a bearer token (none when empty).
func (g *gatewayUsers) call(method, url, token string, body io.Reader, hdr map[string]string) gwResult {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return gwResult{err: err}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := g.http.Do(req)
	if err != nil {
		return gwResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return gwResult{status: resp.StatusCode, body: string(b), err: err, retry: resp.Header.Get("Retry-After")}
}

// markedFunction is a Python function that appends "start ID" and "end
// ID" to a marker file in a shared directory around each invocation
// (sleeping event["sleep"] seconds between), prints "invoked ID" to its
// log and answers {"id": ID}: the marker file is what reached the
// Runtime Server.
func (e *kubeEnv) markedFunction(t *testing.T, name string) (*v1alpha1.Run, string) {
	t.Helper()
	marker := filepath.Join(e.sharedDir(t), "marks")
	src := fmt.Sprintf(`import time

MARK = %q


def handle(event, context):
    with open(MARK, "a") as f:
        f.write("start %%s\n" %% event["id"])
    print("invoked", event["id"], flush=True)
    time.sleep(event.get("sleep", 0))
    with open(MARK, "a") as f:
        f.write("end %%s\n" %% event["id"])
    return {"id": event["id"]}
`, marker)
	runs := e.watchRuns(t, "e2e="+name)
	defer runs.close()
	fn := e.mustCreateRun(t, labelled(newRun(name, function("python", "fn.handle", "fn.py", src)), name))
	ready := runs.until(t, runBound, name+" Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})[fn.Name]
	return ready, marker
}

// marks is the marker file's lines.
func marks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}

// invokePath is a Run's invoke path (its status.endpoint without the
// gateway Service's base).
func invokePath(run *v1alpha1.Run) string {
	return fmt.Sprintf("/v1/namespaces/%s/runs/%s/%s/invoke", run.Namespace, run.Name, run.UID)
}

// An editor invokes, execs and reads logs; a viewer reads logs and gets
// 403 on invoke and exec; an unknown or missing token gets 401, a token
// of 1 MiB and a body past the bound a clear 4xx, an exec upgrade without
// a token 401 before upgrading; and only the editor's one invocation
// reached the Runtime Server.
func testGatewayEditAndView(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	base := anyGateway(urls)
	fn, marker := e.markedFunction(t, "gw-marked")
	if want := "https://stoke-gateway.stoke-system.svc" + invokePath(fn); fn.Status.Endpoint != want {
		t.Errorf("status.endpoint %q, want %q", fn.Status.Endpoint, want)
	}
	invoke := base + invokePath(fn)
	json := map[string]string{"Content-Type": "application/json"}

	if r := g.call(http.MethodPost, invoke, g.editor, strings.NewReader(`{"id":"editor"}`), json); r.status != http.StatusOK || strings.TrimSpace(r.body) != `{"id": "editor"}` && strings.TrimSpace(r.body) != `{"id":"editor"}` {
		t.Errorf("editor invoke: %s", r)
	}
	for _, c := range []struct {
		name, token string
		body        io.Reader
		want        int
	}{
		{"viewer", g.viewer, strings.NewReader(`{"id":"viewer"}`), http.StatusForbidden},
		{"unknown token", "no-such-token", strings.NewReader(`{"id":"unknown"}`), http.StatusUnauthorized},
		{"no token", "", strings.NewReader(`{"id":"none"}`), http.StatusUnauthorized},
		{"1 MiB token", strings.Repeat("t", 1<<20), strings.NewReader(`{"id":"huge-token"}`), http.StatusBadRequest},
		{"oversized body", g.editor, strings.NewReader(`{"id":"big","pad":"` + strings.Repeat("x", bounds.InvokeBody) + `"}`), http.StatusRequestEntityTooLarge},
	} {
		r := g.call(http.MethodPost, invoke, c.token, c.body, json)
		// A header past net/http's bound is 431, also a clear refusal.
		if r.status != c.want && !(c.name == "1 MiB token" && r.status == http.StatusRequestHeaderFieldsTooLarge) {
			t.Errorf("%s invoke: %s, want %d", c.name, r, c.want)
		}
		if r.err == nil && !strings.Contains(r.body, `"errorType"`) {
			t.Errorf("%s invoke: no JSON error body: %s", c.name, r)
		}
	}

	logs := base + "/v1/namespaces/" + runsNamespace + "/runs/" + fn.Name + "/logs"
	for name, token := range map[string]string{"editor": g.editor, "viewer": g.viewer} {
		if r := g.call(http.MethodGet, logs, token, nil, nil); r.status != http.StatusOK || !strings.Contains(r.body, "invoked editor") {
			t.Errorf("%s logs: %s", name, r)
		}
	}
	if r := g.call(http.MethodGet, logs, "", nil, nil); r.status != http.StatusUnauthorized {
		t.Errorf("logs without a token: %s", r)
	}

	execURL := base + "/v1/namespaces/" + runsNamespace + "/runs/" + fn.Name + "/exec?" +
		url.Values{"command": {"bash", "-c", "echo from-exec"}, "stdout": {"true"}}.Encode()
	exec := func(token string) (string, error) {
		x, err := remotecommand.NewWebSocketExecutor(&rest.Config{Host: base, BearerToken: token,
			TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, http.MethodGet, execURL)
		if err != nil {
			return "", err
		}
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), gatewayCall)
		defer cancel()
		err = x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out})
		return out.String(), err
	}
	if out, err := exec(g.editor); err != nil || out != "from-exec\n" {
		t.Errorf("editor exec: %q %v", out, err)
	}
	if out, err := exec(g.viewer); err == nil {
		t.Errorf("viewer exec: %q, want a refusal", out)
	}
	// The refusals, seen on the upgrade itself (client-go does not say
	// the status): 403 for the viewer, 401 without a token, before
	// upgrading.
	upgrade := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": "v5.channel.k8s.io"}
	if r := g.call(http.MethodGet, execURL, g.viewer, nil, upgrade); r.status != http.StatusForbidden {
		t.Errorf("viewer exec upgrade: %s, want 403", r)
	}
	if r := g.call(http.MethodGet, execURL, "", nil, upgrade); r.status != http.StatusUnauthorized {
		t.Errorf("exec upgrade without a token: %s, want 401 before upgrading", r)
	}

	// What reached the Runtime Server: the editor's one invocation.
	if got := strings.Join(marks(t, marker), " "); got != "start_editor end_editor" {
		t.Errorf("the function ran %q, want only the editor's invocation", got)
	}
	e.deleteRun(t, fn.Name)
}

// 64 concurrent invokes of one function through both replicas: exactly
// one runs at a time, the rest are 429, and every answer is its own call's.
func testGatewayConcurrentInvokes(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	bases := gatewayBases(urls)
	fn, marker := e.markedFunction(t, "gw-concurrent")
	// The Run is Ready in this test's watch; each gateway answers from its
	// own informer, which may not have seen that yet (503, not Ready yet):
	// one call through each, until it answers, before the burst.
	for k, base := range bases {
		for deadline := time.Now().Add(runBound); ; {
			r := g.call(http.MethodPost, base+invokePath(fn), g.editor, strings.NewReader(fmt.Sprintf(`{"id":"warm%d"}`, k)),
				map[string]string{"Content-Type": "application/json"})
			if r.status == http.StatusOK {
				break
			}
			if r.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("warm-up call through %s: %s", base, r)
			}
			time.Sleep(100 * time.Millisecond) // the gateway's informer, which has no event for this test to wait on
		}
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	const n = 64
	results := make([]gwResult, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			body := fmt.Sprintf(`{"id":"c%d","sleep":0.2}`, i)
			results[i] = g.call(http.MethodPost, bases[i%len(bases)]+invokePath(fn), g.editor, strings.NewReader(body),
				map[string]string{"Content-Type": "application/json"})
		})
	}
	close(start)
	wg.Wait()
	ok, busy := 0, 0
	for i, r := range results {
		switch r.status {
		case http.StatusOK:
			ok++
			var out struct{ ID string }
			if err := json.Unmarshal([]byte(r.body), &out); err != nil || out.ID != "c"+strconv.Itoa(i) {
				t.Errorf("call c%d answered %s: misrouted", i, r)
			}
		case http.StatusTooManyRequests:
			busy++
		default:
			t.Errorf("call c%d: %s, want 200 or 429", i, r)
		}
	}
	t.Logf("%d concurrent invokes: %d answered, %d busy (429)", n, ok, busy)
	if ok == 0 {
		t.Error("no call was answered")
	}
	// One at a time: every start is followed by its own end.
	m := marks(t, marker)
	if len(m) != 2*ok {
		t.Errorf("the function ran %d invocations, %d were answered: %v", len(m)/2, ok, m)
	}
	for i := 0; i+1 < len(m); i += 2 {
		id := strings.TrimPrefix(m[i], "start_")
		if !strings.HasPrefix(m[i], "start_") || m[i+1] != "end_"+id {
			t.Fatalf("invocations overlapped: %v", m)
		}
	}
	// runtimed counted them on its hop, and each replica serves runtimed's
	// metrics on its /metrics, labelled with the pod (the pod's counters
	// are cumulative: at least this test's calls).
	reader := e.metricsReader(t)
	for name, base := range urls {
		res := g.call(http.MethodGet, base+"/metrics", reader, nil, nil)
		if res.status != http.StatusOK {
			t.Fatalf("gateway %s /metrics: %s", name, res)
		}
		got := runtimedInvocations(t, res.body, fn.Status.AssignedPod)
		if got["ok"] < float64(ok) || got["resource_exhausted"] < float64(busy) || !strings.Contains(res.body, `stoke_runtimed_up{namespace="`+runsNamespace+`",pod="`+fn.Status.AssignedPod+`",runtime="python"} 1`) {
			t.Errorf("gateway %s: runtimed's invocations of pod %s by result %v, want at least %d ok and %d resource_exhausted, and up 1", name, fn.Status.AssignedPod, got, ok, busy)
		}
	}
	if res := g.call(http.MethodGet, anyGateway(urls)+"/metrics", g.editor, nil, nil); res.status != http.StatusForbidden {
		t.Errorf("/metrics with stoke-edit's token: %s, want 403", res)
	}
	e.deleteRun(t, fn.Name)
}

// metricsReader is the token of a ServiceAccount bound to the chart's
// stoke-metrics-reader (get on /metrics).
func (e *kubeEnv) metricsReader(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	const name = "gw-metrics-reader"
	if _, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := e.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "stoke-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: runsNamespace}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// runtimedInvocations sums stoke_runtimed_invocations_total of pod by
// result from a /metrics answer.
func runtimedInvocations(t *testing.T, body, pod string) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	got := map[string]float64{}
	for _, m := range mfs["stoke_runtimed_invocations_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["pod"] == pod {
			got[labels["result"]] += m.GetCounter().GetValue()
		}
	}
	return got
}

// Killing a gateway process under load: the calls in flight to it fail
// (its connections close; behind a Service the proxy answers 502/503) and
// none hangs; the other replica serves meanwhile, and the restarted one
// serves again.
func testGatewayReplicaKilled(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	fn, _ := e.markedFunction(t, "gw-killed")
	var victim, survivor string
	for name := range urls {
		if victim == "" {
			victim = name
		} else {
			survivor = name
		}
	}
	pid := gatewayProcess(t, victim)

	// Load on the victim: each call sleeps 0.5 s in the function, so
	// some are in flight at the kill.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var after []gwResult
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := g.call(http.MethodPost, urls[victim]+invokePath(fn), g.editor,
					strings.NewReader(fmt.Sprintf(`{"id":"k%d-%d","sleep":0.5}`, i, n)), map[string]string{"Content-Type": "application/json"})
				if r.err != nil || r.status >= 500 {
					mu.Lock()
					after = append(after, r)
					mu.Unlock()
					return
				}
			}
		})
	}
	time.Sleep(time.Second) // the load under way: the one sleep is the load itself
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 gateway %s (pid %d): %v", victim, pid, err)
	}
	close(stop)
	wg.Wait() // every caller returned: none hung past its client's bound
	for _, r := range after {
		if r.err != nil {
			var ne net.Error
			if errors.As(r.err, &ne) && ne.Timeout() {
				t.Errorf("a call in flight hung: %v", r.err)
			}
		} else if r.status != http.StatusBadGateway && r.status != http.StatusServiceUnavailable {
			t.Errorf("a call in flight failed with %s, want a closed connection, 502 or 503", r)
		}
	}
	t.Logf("gateway %s killed: %d calls in flight failed: %v", victim, len(after), after)

	// The invocation the victim dispatched runs on: until it ends the
	// function is busy (429), which is an answer too.
	if r := g.invokeWhileBusy(urls[survivor]+invokePath(fn), `{"id":"survivor"}`); r.status != http.StatusOK {
		t.Errorf("the other replica: %s", r)
	}
	// The killed container restarts (the node agent restarts it, as a
	// kubelet does) and serves again.
	pods := e.watchPods(t, stokeNamespace, gatewaySelector)
	defer pods.close()
	back := pods.until(t, installBound, "the killed gateway restarted and ready", func(m map[string]*corev1.Pod) bool {
		p := m[victim]
		if p == nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 1 {
			return false
		}
		_, ok := podReady(p)
		return ok
	})[victim]
	if r := g.invokeWhileBusy("https://"+net.JoinHostPort(back.Status.PodIP, "8443")+invokePath(fn), `{"id":"replacement"}`); r.status != http.StatusOK {
		t.Errorf("the restarted replica: %s", r)
	}
	e.deleteRun(t, fn.Name)
}

// invokeWhileBusy invokes as the editor, again while the function is busy
// with another invocation (429), at most 100 times.
func (g *gatewayUsers) invokeWhileBusy(url, body string) gwResult {
	var r gwResult
	for range 100 {
		r = g.call(http.MethodPost, url, g.editor, strings.NewReader(body), map[string]string{"Content-Type": "application/json"})
		if r.status != http.StatusTooManyRequests {
			return r
		}
		time.Sleep(100 * time.Millisecond) // the Retry-After of a busy function is the caller's to choose
	}
	return r
}

// gatewayProcess is the host pid of `stoke gateway` in the Pod named pod.
func gatewayProcess(t *testing.T, pod string) int {
	t.Helper()
	var found []int
	for _, p := range processes() {
		if len(p.cmdline) < 2 || filepath.Base(p.cmdline[0]) != "stoke" || p.cmdline[1] != "gateway" {
			continue
		}
		env, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == "HOSTNAME="+pod {
				found = append(found, p.pid)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("stoke gateway processes of pod %s: %v, want one", pod, found)
	}
	return found[0]
}
