package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

func taskRun(name string, args ...string) *v1alpha1.Run {
	run := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"suite": "client"}},
		Spec:       v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args}}},
	}
	if name == "" {
		run.GenerateName = "task-"
	}
	return run
}

// waitFor watches the Run until done holds, and returns it.
func waitFor(t *testing.T, c *client.Client, name string, done func(*v1alpha1.Run) bool) *v1alpha1.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	w, err := c.WatchRuns(ctx, "default", client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watching %s: %v", name, err)
		}
		if ev.Object.Name == name && done(ev.Object) {
			return ev.Object
		}
	}
}

func TestTaskRunLifecycle(t *testing.T) {
	c := shared.newClient(t)
	ctx := t.Context()
	run, err := c.CreateRun(ctx, taskRun("", "bash", "-c", `echo out; echo err >&2; echo K=V >> "$STOKE_OUTPUTS"; exit 3`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(run.Name, "task-") || run.Namespace != "default" || run.UID == "" {
		t.Fatalf("created %s/%s uid %q", run.Namespace, run.Name, run.UID)
	}

	// The followed log has both streams and ends with the exit record.
	logs, err := c.Logs(ctx, "", run.Name, true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var exit *int32
	for {
		rec, err := logs.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Attempt != 1 {
			t.Errorf("record of attempt %d", rec.Attempt)
		}
		if rec.Stream == runlog.StreamExit {
			exit = rec.ExitCode
			continue
		}
		got = append(got, rec.Stream+":"+rec.Line)
	}
	logs.Close()
	slices.Sort(got) // the two streams interleave in any order
	if want := []string{"stderr:err", "stdout:out"}; !slices.Equal(got, want) {
		t.Errorf("log = %q, want %q", got, want)
	}
	if exit == nil || *exit != 3 {
		t.Errorf("exit record code = %v, want 3", exit)
	}

	done := waitFor(t, c, run.Name, func(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() })
	if done.Status.Phase != v1alpha1.PhaseFailed || done.Status.ExitCode == nil || *done.Status.ExitCode != 3 {
		t.Errorf("ended %s exit %v", done.Status.Phase, done.Status.ExitCode)
	}
	got1, err := c.GetRun(ctx, "default", run.Name)
	if err != nil || got1.UID != run.UID {
		t.Fatalf("get: %v, uid %q", err, got1.UID)
	}

	list, err := c.ListRuns(ctx, "default", client.ListOptions{LabelSelector: "suite=client", Phases: []v1alpha1.Phase{v1alpha1.PhaseFailed}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Items, func(r v1alpha1.Run) bool { return r.Name == run.Name }) {
		t.Errorf("list by label and phase misses %s", run.Name)
	}
	all, err := c.ListRuns(ctx, "", client.ListOptions{LabelSelector: "suite=nothing-has-this"})
	if err != nil || len(all.Items) != 0 {
		t.Errorf("list of every namespace by an unused label: %d items, %v", len(all.Items), err)
	}

	deleteRun(t, c, run.Name)
	if _, err := c.GetRun(ctx, "default", run.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after delete: %v, want NotFound", err)
	}
	if _, err := c.DeleteRun(ctx, "default", run.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete again: %v, want NotFound", err)
	}
}

// deleteRun deletes the Run and returns once it is gone.
func deleteRun(t *testing.T, c *client.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if _, err := c.DeleteRun(ctx, "default", name); err != nil {
		t.Fatal(err)
	}
	run, err := c.GetRun(ctx, "default", name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.WatchRuns(ctx, "default", client.ListOptions{ResourceVersion: run.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("waiting for %s to go: %v", name, err)
		}
		if ev.Object.Name == name && ev.Type == client.Deleted {
			return
		}
	}
}

func TestCreateAndCancelErrors(t *testing.T) {
	c := shared.newClient(t)
	ctx := t.Context()
	run, err := c.CreateRun(ctx, taskRun("client-sleeper", "sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateRun(ctx, taskRun("client-sleeper", "true")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("create of an existing name: %v, want AlreadyExists", err)
	}
	bad := taskRun("client-bad")
	bad.Spec.Mode.Task = nil
	var apiErr *client.APIError
	if _, err := c.CreateRun(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &apiErr) ||
		apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(err.Error(), "spec.mode") {
		t.Errorf("create of an invalid Run: %v, want a 400 naming spec.mode", err)
	}
	cancelled, err := c.CancelRun(ctx, "", run.Name)
	if err != nil || !cancelled.Spec.CancelRequested {
		t.Fatalf("cancel: %v, cancelRequested %v", err, cancelled.Spec.CancelRequested)
	}
	end := waitFor(t, c, run.Name, func(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() })
	if end.Status.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("cancelled run ended %s", end.Status.Phase)
	}
	if _, err := c.CancelRun(ctx, "", "client-no-such-run"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("cancel of a missing Run: %v, want NotFound", err)
	}
	// The server is shared: the name is free again for -count=2.
	deleteRun(t, c, run.Name)
}

func TestWatchSeesEveryPhaseInOrder(t *testing.T) {
	c := shared.newClient(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	list, err := c.ListRuns(ctx, "default", client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.WatchRuns(ctx, "default", client.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	run, err := c.CreateRun(ctx, taskRun("", "true"))
	if err != nil {
		t.Fatal(err)
	}
	order := []v1alpha1.Phase{"", v1alpha1.PhasePending, v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded}
	var first client.EventType
	last := 0
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Object.Name != run.Name {
			continue
		}
		if first == "" {
			first = ev.Type
		}
		i := slices.Index(order, ev.Object.Status.Phase)
		if i < last {
			t.Fatalf("phase %q after %q", ev.Object.Status.Phase, order[last])
		}
		last = i
		if ev.Object.Status.Phase == v1alpha1.PhaseSucceeded {
			break
		}
	}
	if first != client.Added {
		t.Errorf("first event %s, want ADDED", first)
	}
}

func TestInvokeAFunction(t *testing.T) {
	c := shared.newClient(t)
	ctx := t.Context()
	fn := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: "client-fn"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.sh", Text: `
handle() {
	echo "SEEN=$1" >> "$STOKE_OUTPUTS"
	if [ "$1" = '"fail"' ]; then echo boom >&2; return 3; fi
	printf '{"got":%s}' "$1"
}
`}}},
	}
	if _, err := c.CreateRun(ctx, fn); err != nil {
		t.Fatal(err)
	}
	ready := waitFor(t, c, fn.Name, func(r *v1alpha1.Run) bool {
		return r.Status.Phase == v1alpha1.PhaseReady || r.Status.Phase.Terminal()
	})
	if ready.Status.Phase != v1alpha1.PhaseReady || !strings.Contains(ready.Status.Endpoint, string(ready.UID)) {
		t.Fatalf("function %s, endpoint %q: %s", ready.Status.Phase, ready.Status.Endpoint, ready.Status.Message)
	}
	uid := string(ready.UID)

	res, err := c.Invoke(ctx, "default", fn.Name, uid, []byte(`{"a":1}`), client.InvokeOptions{InvocationID: "client-inv-1", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Body) != `{"got":{"a":1}}` || res.StatusCode != http.StatusOK || res.InvocationID != "client-inv-1" {
		t.Errorf("invoke = %d %q id %q", res.StatusCode, res.Body, res.InvocationID)
	}
	if res.Outputs["SEEN"] != `{"a":1}` {
		t.Errorf("outputs = %v", res.Outputs)
	}

	// A handler failure is a FunctionError inside an APIError.
	_, err = c.Invoke(ctx, "default", fn.Name, uid, []byte(`"fail"`), client.InvokeOptions{})
	var apiErr *client.APIError
	var fe *errdefs.FunctionError
	if !errors.As(err, &apiErr) || !errors.As(err, &fe) || apiErr.StatusCode != http.StatusInternalServerError ||
		fe.Type == "" || apiErr.InvocationID == "" || errdefs.HTTPStatus(err) != http.StatusInternalServerError {
		t.Errorf("failing invoke: %v (%#v)", err, apiErr)
	}

	if _, err := c.Invoke(ctx, "default", fn.Name, "not-its-uid", []byte(`{}`), client.InvokeOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("invoke with a wrong UID: %v, want NotFound", err)
	}
	big := make([]byte, bounds.InvokeBody+1)
	if _, err := c.Invoke(ctx, "default", fn.Name, uid, big, client.InvokeOptions{}); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("invoke with %d bytes: %v, want TooLarge", len(big), err)
	}
	if _, err := c.Invoke(ctx, "default", fn.Name, uid, nil, client.InvokeOptions{InvocationID: strings.Repeat("x", 129)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("invoke with a 129-byte ID: %v, want InvalidArgument", err)
	}

	// The function's stderr is in its log, with the invocation's ID.
	logs, err := c.Logs(ctx, "default", fn.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	found := false
	for {
		rec, err := logs.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		found = found || (rec.Line == "boom" && rec.InvocationID == apiErr.InvocationID)
	}
	if !found {
		t.Errorf("the log has no line \"boom\" of invocation %s", apiErr.InvocationID)
	}

	deleteRun(t, c, fn.Name)
}

func TestRuntimes(t *testing.T) {
	c := shared.newClient(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	w, err := c.WatchRuntimes(ctx, "", client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "client-pool"}, Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 0, Runs: 1}}
	applied, err := c.ApplyRuntime(ctx, rt)
	if err != nil || applied.Spec.Server != "bash" || applied.Namespace != "default" {
		t.Fatalf("apply: %v, %+v", err, applied)
	}
	rt.Spec.Runs = 2
	if _, err := c.ApplyRuntime(ctx, rt); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetRuntime(ctx, "default", "client-pool")
	if err != nil || got.Spec.Runs != 2 {
		t.Fatalf("get: %v, runs %d", err, got.Spec.Runs)
	}
	list, err := c.ListRuntimes(ctx, "", client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range list.Items {
		names = append(names, r.Name)
	}
	for _, want := range []string{"bash", "python", "client-pool"} {
		if !slices.Contains(names, want) {
			t.Errorf("list = %v, misses %s", names, want)
		}
	}
	rt.Spec.Server = "python"
	if _, err := c.ApplyRuntime(ctx, rt); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("changing spec.server: %v, want InvalidArgument", err)
	}
	if _, err := c.DeleteRuntime(ctx, "default", "client-pool"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetRuntime(ctx, "default", "client-pool"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after delete: %v, want NotFound", err)
	}
	// The watch saw it come, change and go.
	var seen []client.EventType
	for len(seen) < 3 || seen[len(seen)-1] != client.Deleted {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watch after %v: %v", seen, err)
		}
		if ev.Object.Name == "client-pool" {
			seen = append(seen, ev.Type)
		}
	}
	if seen[0] != client.Added || !slices.Contains(seen, client.Modified) {
		t.Errorf("events = %v", seen)
	}
}

func TestAuthenticationAndReachability(t *testing.T) {
	ctx := t.Context()
	bad, err := client.New(client.Config{Server: shared.URL, Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *client.APIError
	if _, err := bad.ListRuns(ctx, "", client.ListOptions{}); !errors.Is(err, errdefs.ErrUnauthenticated) || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong token: %v, want a 401", err)
	}

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	down, err := client.New(client.Config{Server: addr, Token: "x"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.GetRun(ctx, "default", "x")
	var unreachable *client.UnreachableError
	if !errors.As(err, &unreachable) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "http://"+addr) {
		t.Errorf("unreachable server: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := shared.newClient(t).GetRun(cctx, "default", "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want context.Canceled", err)
	}
}
