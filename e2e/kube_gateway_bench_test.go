package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// BenchmarkKubeGateway measures a Python function invoked through `stoke
// gateway` as deploy/ installs it, each figure beside its floor from the
// same run:
//
//   - WarmInvoke: the auth cache warm, p50 and p99 (gw-*), beside the same
//     function invoked directly on runtimed's mutual-TLS hop with the
//     gateway's certificate (hop-*): what the gateway adds; and beside the
//     same function invoked through standalone's gateway (a `stoke up` on
//     this machine, in the same loop: up-*), its peer.
//   - FirstToken: each call with a token the gateway has not seen (a new
//     TokenRequest each time, made outside the timing), p50, beside one
//     bare SubjectAccessReview by the admin (sar-p50-ms).
func BenchmarkKubeGateway(b *testing.B) {
	e := startKube(b)
	g := e.gatewayUsers(b)
	base := anyGateway(e.gateways(b, 2))
	fn := e.echoFunction(b)
	url := base + invokePath(fn)
	body := `{"id":"bench"}`
	hdr := map[string]string{"Content-Type": "application/json"}
	call := func(token string) {
		if r := g.call(http.MethodPost, url, token, strings.NewReader(body), hdr); r.status != http.StatusOK {
			b.Fatalf("invoke: %s", r)
		}
	}
	call(g.editor) // the cache warm, the connections open

	b.Run("WarmInvoke", func(b *testing.B) {
		conn := e.gatewayConn(b, e.gatewayCredentials(b), fn)
		upURL, upToken := standaloneEcho(b)
		callUp := func() {
			if r := invokeEndpoint(apiClient, upToken, upURL, body); r.err != nil || r.status != http.StatusOK {
				b.Fatalf("invoke through stoke up: %d %s %v", r.status, r.body, r.err)
			}
		}
		callUp() // warm
		// -kube-pprof: every process's CPU profile while the loop runs
		// (as long as -kube-pprof-seconds, or the loop, lasts).
		profiled := func() {}
		if *kubePprof != "" {
			profiled = e.profileAll(b, filepath.Join(*kubePprof, fmt.Sprintf("gw%d", benchRound.Add(1))), *kubePprofSeconds)
		}
		var gw, hop, up []time.Duration
		for b.Loop() {
			t0 := time.Now()
			callUp()
			up = append(up, time.Since(t0))
			t0 = time.Now()
			call(g.editor)
			gw = append(gw, time.Since(t0))
			t0 = time.Now()
			if _, err := invokeHop(conn, fn, body); err != nil {
				b.Fatal(err)
			}
			hop = append(hop, time.Since(t0))
		}
		profiled()
		reportPercentilesAs(b, gw, "gw")
		reportPercentilesAs(b, hop, "hop")
		reportPercentilesAs(b, up, "up")
	})
	b.Run("FirstToken", func(b *testing.B) {
		ctx := context.Background()
		var first, sar []time.Duration
		for b.Loop() {
			b.StopTimer()
			tr, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).CreateToken(ctx, "gw-editor", &authnv1.TokenRequest{}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			t0 := time.Now()
			call(tr.Status.Token)
			first = append(first, time.Since(t0))
			t0 = time.Now()
			if _, err := e.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: "system:serviceaccount:" + runsNamespace + ":gw-editor",
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: runsNamespace, Verb: "create", Group: "stoke.dev",
					Resource: "runs", Subresource: "invoke", Name: fn.Name},
			}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			sar = append(sar, time.Since(t0))
		}
		reportPercentilesAs(b, first, "first")
		reportPercentilesAs(b, sar, "sar")
	})
}

// reportPercentilesAs reports the p50 and p99 of lat in milliseconds as
// PREFIX-p50-ms and PREFIX-p99-ms.
func reportPercentilesAs(b *testing.B, lat []time.Duration, prefix string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), prefix+"-p50-ms")
	b.ReportMetric(at(0.99), prefix+"-p99-ms")
}

// standaloneEcho starts a `stoke up` with the echo function Ready and
// returns its invoke URL and token (the peer of the Kubernetes gateway).
func standaloneEcho(b *testing.B) (url, token string) {
	u := startUp(b, b.TempDir())
	b.Cleanup(func() {
		if err := u.Stop(); err != nil {
			b.Error(err)
		}
	})
	w := u.watchRuns(b)
	u.createRun(b, newRun("gw-bench", v1alpha1.RunSpec{Runtime: "python",
		Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "fn.handle"}},
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.py", Text: "def handle(event, context):\n    return event\n"}}}))
	ready := w.until(b, 2*time.Minute, "gw-bench Ready in stoke up", func(runs map[string]*v1alpha1.Run) bool {
		r := runs["gw-bench"]
		return r != nil && (r.Status.Phase.Terminal() || r.Status.Phase == v1alpha1.PhaseReady && r.Status.Endpoint != "")
	})["gw-bench"]
	if ready.Status.Phase != v1alpha1.PhaseReady {
		b.Fatalf("gw-bench in stoke up: %s %s", ready.Status.Phase, ready.Status.Message)
	}
	return ready.Status.Endpoint, u.Token
}

// echoFunction is a Ready Python function answering its input.
func (e *kubeEnv) echoFunction(b *testing.B) *v1alpha1.Run {
	runs := e.watchRuns(b, "e2e=gw-bench")
	defer runs.close()
	fn := e.mustCreateRun(b, labelled(newRun("gw-bench", function("python", "fn.handle", "fn.py",
		"def handle(event, context):\n    return event\n")), "gw-bench"))
	return runs.until(b, runBound, "gw-bench Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})[fn.Name]
}
