package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/logsummary"
	"stoke.dev/stoke/internal/syncbuf"
)

// holdHandler tells the test through $IN that a "hold" call is in flight,
// then holds the function's one slot until the test writes to $OUT.
const holdHandler = `handle() {
	if [ "$1" = '"hold"' ]; then
		echo in > "$IN"
		read -r _ < "$OUT"
	fi
	printf '{}'
}
`

// A flood of 429s — concurrent clients over real HTTP against a real
// function whose one slot a call holds — writes a few lines of log, not
// one per refusal; every refusal is counted in the metrics.
func TestFloodOf429sWritesAFewLines(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	for _, f := range []string{in, out} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var log syncbuf.Buffer
	metrics := gateway.NewMetrics(plane.RunPhases)
	url := serve(t, gateway.Config{Metrics: metrics, Logger: slog.New(slog.NewJSONHandler(&log, nil)),
		// No interval ends during the flood, however slow the machine.
		FailedInvokeLog: logsummary.Config{Interval: time.Hour}})
	ctx := context.Background()
	_, err := plane.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "flood", Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.sh", Text: holdHandler}},
			Env:    []v1alpha1.EnvVar{{Name: "IN", Value: in}, {Name: "OUT", Value: out}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", "flood") })
	fn := awaitReadyEndpoint(t, url, "flood")

	held := make(chan int, 1)
	go func() { held <- post(fn, `"hold"`) }()
	f, err := os.Open(in) // until the handler opens it: the call is in flight
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(f)
	f.Close()

	const clients, each = 16, 100
	var wg sync.WaitGroup
	statuses := make(chan int, clients*each)
	for range clients {
		wg.Go(func() {
			for range each {
				statuses <- post(fn, `"x"`)
			}
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusTooManyRequests {
			t.Fatalf("a call beside the held one answered %d, want 429", s)
		}
	}
	if err := os.WriteFile(out, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := <-held; s != http.StatusOK {
		t.Fatalf("the held call answered %d", s)
	}

	t.Logf("%d refusals wrote %d bytes of log:\n%s", clients*each, len(log.String()), log.String())
	if n := len(log.String()); n > 4096 {
		t.Errorf("%d refusals wrote %d bytes of log, want at most 4 KiB", clients*each, n)
	}
	if !strings.Contains(log.String(), `"msg":"invocations failed","run":"default/flood","count":1,"by_kind":"429:1"`) {
		t.Errorf("no line for the first refusal")
	}
	m := string(do(t, http.MethodGet, url+"/metrics", "", nil).body)
	for _, want := range []string{`stoke_invocations_total{code="429"} 1600`, "stoke_invocation_log_lines_summarised_total 1599"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// post invokes fn with body and returns the status, 0 when the request
// failed; off the test goroutine.
func post(fn, body string) int {
	req, err := http.NewRequest(http.MethodPost, fn, strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// awaitReadyEndpoint waits for the function Run name to be Ready and
// returns its invoke URL under url.
func awaitReadyEndpoint(t *testing.T, url, name string) string {
	t.Helper()
	run := awaitPhase(t, name, v1alpha1.PhaseReady)
	return url + "/v1/namespaces/default/runs/" + name + "/" + string(run.UID) + "/invoke"
}
