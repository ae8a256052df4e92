package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/scheduler"
)

// TestDockerCreatedSurvivesRestart: a container created and not started
// is its Run, held: `stoke up` restarted in between still lists it as
// created, starts it (it runs then, not before) and removes another. A
// `-t` container's terminal starts at create's ConsoleSize, with no
// resize from any client.
func TestDockerCreatedSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	up := startUp(t, dir)
	cli := sdkClient(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	create := func(name string) string {
		t.Helper()
		created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: &container.Config{
			Image: "bash", Cmd: []string{"sh", "-c", "echo started"}}})
		if err != nil {
			t.Fatal(err)
		}
		return created.ID
	}
	id, other := create("held-start"), create("held-rm")
	tty, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "held-tty",
		Config:     &container.Config{Image: "bash", Tty: true, Cmd: []string{"stty", "size"}},
		HostConfig: &container.HostConfig{ConsoleSize: [2]uint{33, 111}}})
	if err != nil {
		t.Fatal(err)
	}
	// The Run is there, held, and says so once the scheduler saw it.
	w := up.watchRuns(t)
	w.until(t, time.Minute, "held-start held", func(runs map[string]*v1alpha1.Run) bool {
		r := runs["held-start"]
		if r == nil {
			return false
		}
		c := meta.FindStatusCondition(r.Status.Conditions, scheduler.ConditionScheduled)
		return c != nil && c.Reason == scheduler.ReasonHeld
	})
	w.stop()
	if r := up.getRun(t, "held-start"); !r.Spec.Held || r.Status.Phase != v1alpha1.PhasePending || r.Status.AssignedPod != "" {
		t.Fatalf("created container's Run: held %v, phase %q, pod %q", r.Spec.Held, r.Status.Phase, r.Status.AssignedPod)
	}

	up.stop(t)
	up = startUp(t, dir)
	cli = sdkClient(t, dir)

	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("status", "created")})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range list.Items {
		ids[c.ID] = true
		if c.Status != "Created" {
			t.Errorf("%s status %q", c.Names, c.Status)
		}
	}
	if len(list.Items) != 3 || !ids[id] || !ids[other] || !ids[tty.ID] {
		t.Fatalf("created containers after the restart: %+v", list.Items)
	}
	if ci, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err != nil || ci.Container.State.Status != container.StateCreated || ci.Container.State.Running {
		t.Fatalf("inspect after the restart: %+v %v", ci.Container.State, err)
	}

	if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := cli.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 {
			t.Errorf("exit %d, want 0", res.StatusCode)
		}
	case err := <-wait.Error:
		t.Fatal(err)
	}
	logs, err := cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, logs); err != nil {
		t.Fatal(err)
	}
	logs.Close()
	if out.String() != "started\n" {
		t.Errorf("logs %q", out.String())
	}
	if r := up.getRun(t, "held-start"); r.Spec.Held || r.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Errorf("started container's Run: held %v, phase %q", r.Spec.Held, r.Status.Phase)
	}

	// The terminal's size, from create, before any resize.
	if _, err := cli.ContainerStart(ctx, tty.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	wait = cli.ContainerWait(ctx, tty.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 {
			t.Errorf("stty size: exit %d, want 0", res.StatusCode)
		}
	case err := <-wait.Error:
		t.Fatal(err)
	}
	raw, err := cli.ContainerLogs(ctx, tty.ID, client.ContainerLogsOptions{ShowStdout: true})
	if err != nil {
		t.Fatal(err)
	}
	size, err := io.ReadAll(raw)
	raw.Close()
	if err != nil || strings.TrimSpace(string(size)) != "33 111" {
		t.Errorf("stty size of a -t container created with ConsoleSize 33×111: %q %v", size, err)
	}
	if ci, err := cli.ContainerInspect(ctx, tty.ID, client.ContainerInspectOptions{}); err != nil || ci.Container.HostConfig.ConsoleSize != [2]uint{33, 111} {
		t.Errorf("inspect ConsoleSize: %v %v", ci.Container.HostConfig, err)
	}

	if _, err := cli.ContainerRemove(ctx, other, client.ContainerRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerInspect(ctx, other, client.ContainerInspectOptions{}); err == nil || !strings.Contains(err.Error(), "No such container") {
		t.Errorf("inspect after remove: %v", err)
	}
	if status, body := up.do(t, "GET", "/v1/namespaces/default/runs/held-rm", nil); status != 404 {
		t.Errorf("the removed container's Run: %d %s", status, body)
	}
}
