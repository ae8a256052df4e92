package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/testbin"
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
	gateways := e.gateways(b, 2)
	base := anyGateway(gateways)
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
		// -kube-trace: every process's Go execution trace over the same
		// time, to find the slow calls' moments in (logSlowGateway logs them).
		traced, traceDir := func() {}, ""
		if *kubeTrace != "" {
			traceDir = filepath.Join(*kubeTrace, fmt.Sprintf("gw%d", benchRound.Add(1)))
			traced = e.traceAll(b, traceDir, *kubePprofSeconds)
		}
		// With -kube-trace or -kube-sched, the gateways' auth cache misses
		// and garbage collections during the loop, from their /metrics
		// (not otherwise: a scrape's garbage brings the next collection
		// nearer).
		diagnose := *kubeTrace != "" || *kubeSched != ""
		var reader string
		var before map[string]gwCounters
		if diagnose {
			reader = e.metricsReader(b)
			before = gatewayCounters(b, g, reader, gateways)
		}
		// Warm again: the setup above may outlast the auth cache's 10 s,
		// and the figure is the warm cache's.
		call(g.editor)
		// -kube-sched: each gateway call's CPU and run-queue wait of every
		// process on its path, read from the kernel around the call.
		var sched *schedSampler
		var schedCalls [][]schedStat
		if *kubeSched != "" {
			var err error
			if sched, err = newSchedSampler(podOfURL(gateways, base), fn.Status.AssignedPod); err != nil {
				b.Fatal(err)
			}
		}
		// This process (the benchmark's clients and the test node agents,
		// the kubelet's stand-in, which in a cluster run on other
		// machines) collects its garbage before the loop and not during
		// it: its collections, a few ms of CPU on both cores at once,
		// preempted the processes measured and made most of the p99
		// (docs/benchmarks.md). The loop's own garbage is small.
		// The warm-up calls above are each function's first since its
		// registration took its pod's spare worker, and the pod then makes
		// the next spare (an interpreter's start, tens of ms of CPU, once
		// per registration: runtime-server.md): the loop starts once the
		// spares are made, so that it times warm calls and not that start.
		if _, err := testbin.AwaitPythonSparesIdle(os.Getpid(), runBound); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		gcPercent := debug.SetGCPercent(-1)
		var gw, hop, up []time.Duration
		var at []time.Time // each iteration's start
		for b.Loop() {
			t0 := time.Now()
			at = append(at, t0)
			callUp()
			up = append(up, time.Since(t0))
			var s0 []schedStat
			if sched != nil {
				s0 = sched.sample()
			}
			t0 = time.Now()
			call(g.editor)
			gw = append(gw, time.Since(t0))
			if sched != nil {
				s1 := sched.sample()
				for i := range s1 {
					s1[i] = s1[i].sub(s0[i])
				}
				schedCalls = append(schedCalls, s1)
			}
			t0 = time.Now()
			if _, err := invokeHop(conn, fn, body); err != nil {
				b.Fatal(err)
			}
			hop = append(hop, time.Since(t0))
		}
		b.StopTimer()
		debug.SetGCPercent(gcPercent)
		profiled()
		traced()
		if traceDir != "" {
			writeCalls(b, filepath.Join(traceDir, "calls.tsv"), at, gw, hop, up)
		}
		logSlowGateway(b, at, gw, hop, up, 5)
		if sched != nil {
			writeSched(b, *kubeSched, sched.roles, schedCalls, gw, 8)
		}
		// The scrape's own lookups are hits unless 10 s passed since the
		// first scrape cached its decision.
		if diagnose {
			var sb strings.Builder
			for name, a := range gatewayCounters(b, g, reader, gateways) {
				fmt.Fprintf(&sb, "\ngateway %s during the loop (%v): %s", name, time.Since(at[0]).Round(time.Millisecond), a.since(before[name]))
			}
			b.Log(sb.String())
		}
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

// logSlowGateway logs the n slowest gateway calls of the WarmInvoke loop:
// when each started (wall clock, to find it in -kube-trace's traces), its
// place in the loop, and the same iteration's other two calls.
func logSlowGateway(b *testing.B, at []time.Time, gw, hop, up []time.Duration, n int) {
	idx := make([]int, len(gw))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int { return cmp.Compare(gw[j], gw[i]) })
	var sb strings.Builder
	for _, i := range idx[:min(n, len(idx))] {
		// The gateway's call started after the iteration's stoke up call.
		fmt.Fprintf(&sb, "\nslow gateway call %d/%d at %s (loop +%v): gw %.3f ms; the same iteration's hop %.3f ms, stoke up %.3f ms",
			i, len(gw), at[i].Add(up[i]).UTC().Format("15:04:05.000000"), at[i].Sub(at[0]).Round(time.Millisecond),
			ms(gw[i]), ms(hop[i]), ms(up[i]))
	}
	b.Log(sb.String())
}

// writeSched appends to path, for the n slowest gateway calls, each
// process's CPU time and run-queue wait during the call, and for every
// process the p50 and p99 of both over all calls.
func writeSched(b *testing.B, path string, roles []string, calls [][]schedStat, gw []time.Duration, n int) {
	idx := make([]int, len(gw))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int { return cmp.Compare(gw[j], gw[i]) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %s, %d calls: CPU time, run-queue wait summed over a process's threads, thread runs", time.Now().UTC().Format(time.RFC3339), b.Name(), len(gw))
	for _, i := range idx[:min(n, len(idx))] {
		fmt.Fprintf(&sb, "\ncall %d gw %.3f ms", i, ms(gw[i]))
		for r, role := range roles {
			st := calls[i][r]
			fmt.Fprintf(&sb, "; %s cpu %.3f wait %.3f runs %d", role, ms(st.cpu), ms(st.wait), st.runs)
		}
	}
	for r, role := range roles {
		var cpu, wait []time.Duration
		var runs []int64
		for _, c := range calls {
			cpu, wait, runs = append(cpu, c[r].cpu), append(wait, c[r].wait), append(runs, c[r].runs)
		}
		slices.Sort(cpu)
		slices.Sort(wait)
		slices.Sort(runs)
		q := func(v []time.Duration, f float64) float64 { return ms(v[min(len(v)-1, int(f*float64(len(v))))]) }
		fmt.Fprintf(&sb, "\n%s per gateway call: cpu p50 %.3f p99 %.3f ms; run-queue wait p50 %.3f p99 %.3f max %.3f ms; runs p50 %d p99 %d",
			role, q(cpu, 0.5), q(cpu, 0.99), q(wait, 0.5), q(wait, 0.99), ms(wait[len(wait)-1]), runs[len(runs)/2], runs[min(len(runs)-1, len(runs)*99/100)])
	}
	sb.WriteString("\n")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		_, err = f.WriteString(sb.String())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		b.Error(err)
	}
}

// podOfURL is the name of the Pod whose URL in urls is u.
func podOfURL(urls map[string]string, u string) string {
	for name, v := range urls {
		if v == u {
			return name
		}
	}
	return ""
}

// writeCalls writes every call of the WarmInvoke loop to path, one
// iteration a line: the start (UTC wall clock) and duration in ms of the
// gateway's call, the hop's and stoke up's, to find each in -kube-trace's
// traces.
func writeCalls(b *testing.B, path string, at []time.Time, gw, hop, up []time.Duration) {
	var sb strings.Builder
	sb.WriteString("# i\tgw_start\tgw_ms\thop_start\thop_ms\tup_start\tup_ms\n")
	const clock = "15:04:05.000000"
	for i := range gw {
		gwAt := at[i].Add(up[i])
		fmt.Fprintf(&sb, "%d\t%s\t%.3f\t%s\t%.3f\t%s\t%.3f\n", i, gwAt.UTC().Format(clock), ms(gw[i]),
			gwAt.Add(gw[i]).UTC().Format(clock), ms(hop[i]), at[i].UTC().Format(clock), ms(up[i]))
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		b.Error(err)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// gwCounters are a gateway's counters that say what else happened during
// a loop of warm invokes: auth cache misses (a warm loop has none), and
// its garbage collections.
type gwCounters struct {
	authMisses, gcs, gcPauseSeconds float64
}

func (c gwCounters) since(b gwCounters) string {
	return fmt.Sprintf("%.0f auth cache misses, %.0f garbage collections (%.3f ms of pauses)",
		c.authMisses-b.authMisses, c.gcs-b.gcs, (c.gcPauseSeconds-b.gcPauseSeconds)*1e3)
}

// gatewayCounters reads every gateway's gwCounters from its /metrics.
func gatewayCounters(b *testing.B, g *gatewayUsers, reader string, gateways map[string]string) map[string]gwCounters {
	b.Helper()
	out := map[string]gwCounters{}
	for name, base := range gateways {
		res := g.call(http.MethodGet, base+"/metrics", reader, nil, nil)
		if res.status != http.StatusOK {
			b.Fatalf("gateway %s /metrics: %s", name, res)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(strings.NewReader(res.body))
		if err != nil {
			b.Fatalf("gateway %s /metrics: %v", name, err)
		}
		var c gwCounters
		for _, m := range mfs["stoke_gateway_auth_cache_lookups_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "miss" {
					c.authMisses += m.GetCounter().GetValue()
				}
			}
		}
		for _, m := range mfs["go_gc_duration_seconds"].GetMetric() {
			c.gcs += float64(m.GetSummary().GetSampleCount())
			c.gcPauseSeconds += m.GetSummary().GetSampleSum()
		}
		out[name] = c
	}
	return out
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
