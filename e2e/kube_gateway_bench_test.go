package e2e

import (
	"context"
	"net/http"
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
//     gateway's certificate (hop-*): what the gateway adds.
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
		var gw, hop []time.Duration
		for b.Loop() {
			t0 := time.Now()
			call(g.editor)
			gw = append(gw, time.Since(t0))
			t0 = time.Now()
			if _, err := invokeHop(conn, fn, body); err != nil {
				b.Fatal(err)
			}
			hop = append(hop, time.Since(t0))
		}
		reportPercentilesAs(b, gw, "gw")
		reportPercentilesAs(b, hop, "hop")
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
