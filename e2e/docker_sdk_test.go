package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/docker"
)

// sdkClient is the Docker Go SDK on a stoke up's socket, at the newest API
// version the server speaks.
func sdkClient(t testing.TB, dataDir string) *client.Client {
	t.Helper()
	cli, err := client.New(client.WithHost("unix://"+dockerSocket(dataDir)), client.WithAPIVersion(docker.APIVersion))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestDockerSDK runs a container's life cycle and 64 concurrent `run
// --rm` through the Docker Go SDK, and sends bad input on the socket.
func TestDockerSDK(t *testing.T) {
	up := startUp(t, t.TempDir())
	cli := sdkClient(t, up.DataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if v := cli.ClientVersion(); v != docker.APIVersion {
		t.Fatalf("client version %s, want %s", v, docker.APIVersion)
	}

	t.Run("Lifecycle", func(t *testing.T) {
		created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "sdk-life", Config: &container.Config{
			Image: "bash", Labels: map[string]string{"suite": "sdk"},
			Cmd: []string{"sh", "-c", "echo out; echo err >&2; exec sleep 600"}}})
		if err != nil {
			t.Fatal(err)
		}
		id := created.ID
		if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
			t.Fatal(err)
		}
		// Exec with stdin to its EOF, hijacked, multiplexed.
		ex, err := cli.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: []string{"sh", "-c", "cat; echo bye >&2"}, AttachStdin: true, AttachStdout: true, AttachStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
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
		insp, err := cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
		if err != nil || insp.Running || insp.ExitCode != 0 || insp.ContainerID != id {
			t.Errorf("exec inspect: %+v %v", insp, err)
		}
		testExecInspect(t, ctx, cli, id)
		// Logs, multiplexed.
		logs, err := cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		out.Reset()
		errOut.Reset()
		if _, err := stdcopy.StdCopy(&out, &errOut, logs); err != nil {
			t.Fatal(err)
		}
		logs.Close()
		if out.String() != "out\n" || errOut.String() != "err\n" {
			t.Errorf("logs: stdout %q stderr %q", out.String(), errOut.String())
		}
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", "suite=sdk")})
		if err != nil || len(list.Items) != 1 || list.Items[0].ID != id || list.Items[0].State != container.StateRunning {
			t.Errorf("list: %+v %v", list.Items, err)
		}
		wait := cli.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
		if _, err := cli.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-wait.Result:
			if res.StatusCode != 137 {
				t.Errorf("wait after kill: %d, want 137", res.StatusCode)
			}
		case err := <-wait.Error:
			t.Fatal(err)
		}
		ci, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil || ci.Container.State.Running || ci.Container.State.ExitCode != 137 || ci.Container.State.OOMKilled || ci.Container.Name != "/sdk-life" {
			t.Errorf("inspect: %+v %v", ci.Container.State, err)
		}
		if _, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err == nil || !strings.Contains(err.Error(), "No such container") {
			t.Errorf("inspect after remove: %v", err)
		}
	})

	t.Run("StatsEvents", func(t *testing.T) {
		since := strconv.FormatInt(time.Now().Unix()-1, 10)
		created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "sdk-busy", Config: &container.Config{
			Image: "bash", Cmd: []string{"sh", "-c", "while :; do :; done"}}})
		if err != nil {
			t.Fatal(err)
		}
		id := created.ID
		if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
			t.Fatal(err)
		}
		// Streaming: each sample carries the one before it.
		st, err := cli.ContainerStats(ctx, id, client.ContainerStatsOptions{Stream: true})
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(st.Body)
		var first, second container.StatsResponse
		if err := dec.Decode(&first); err != nil {
			t.Fatal(err)
		}
		if err := dec.Decode(&second); err != nil {
			t.Fatal(err)
		}
		st.Body.Close()
		if second.PreCPUStats.CPUUsage.TotalUsage != first.CPUStats.CPUUsage.TotalUsage || !second.PreRead.Equal(first.Read) ||
			second.CPUStats.CPUUsage.TotalUsage <= first.CPUStats.CPUUsage.TotalUsage || second.CPUStats.SystemUsage <= first.CPUStats.SystemUsage {
			t.Errorf("stats stream: first cpu %+v, second cpu %+v pre %+v: want the second after the first, a busy loop's CPU grown", first.CPUStats, second.CPUStats, second.PreCPUStats)
		}
		if second.MemoryStats.Usage == 0 || second.MemoryStats.Limit < second.MemoryStats.Usage || second.PidsStats.Current != 1 || second.Name != "/sdk-busy" {
			t.Errorf("stats: memory %+v pids %+v name %q", second.MemoryStats, second.PidsStats, second.Name)
		}
		// The kill's die, followed from --since.
		evctx, stop := context.WithCancel(ctx)
		defer stop()
		evs := cli.Events(evctx, client.EventsListOptions{Since: since, Filters: make(client.Filters).Add("container", "sdk-busy").Add("type", "container")})
		if _, err := cli.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
			t.Fatal(err)
		}
		var actions []string
	read:
		for {
			select {
			case m := <-evs.Messages:
				actions = append(actions, string(m.Action)+m.Actor.Attributes["exitCode"])
				if m.Action == "die" {
					break read
				}
			case err := <-evs.Err:
				t.Fatalf("events: %v (after %v)", err, actions)
			}
		}
		if got := strings.Join(actions, ","); got != "create,start,kill,die137" {
			t.Errorf("events: %s, want create,start,kill,die137", got)
		}
		// Not running: one sample of zeros.
		st, err = cli.ContainerStats(ctx, id, client.ContainerStatsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var stopped container.StatsResponse
		if err := json.NewDecoder(st.Body).Decode(&stopped); err != nil || stopped.CPUStats.CPUUsage.TotalUsage != 0 {
			t.Errorf("stats of a stopped container: %+v %v", stopped.CPUStats, err)
		}
		st.Body.Close()
		if _, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ConcurrentRunRm", func(t *testing.T) {
		const n = 64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				errs <- runRm(ctx, cli, fmt.Sprintf("rm-%d", i))
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", "suite=rm")})
		if err != nil || len(list.Items) != 0 {
			t.Errorf("containers left behind: %d %v", len(list.Items), err)
		}
		status, body := up.do(t, http.MethodGet, "/v1/namespaces/default/runs?labelSelector=suite%3Drm", nil)
		var runs v1alpha1.RunList
		if status != http.StatusOK || json.Unmarshal(body, &runs) != nil || len(runs.Items) != 0 {
			t.Errorf("Runs left behind: %d %s", status, body)
		}
	})

	t.Run("Attach", func(t *testing.T) {
		testSDKAttach(t, ctx, cli)
	})
	t.Run("Detach", func(t *testing.T) {
		testSDKDetach(t, ctx, cli)
	})

	t.Run("BadInput", func(t *testing.T) {
		raw := rawDocker(up.DataDir)
		big := `{"Image":"bash","Cmd":["` + strings.Repeat("x", 2<<20) + `"]}`
		for _, tc := range []struct {
			name, method, path, body string
			header                   http.Header
			status                   int
			message                  string
		}{
			{"unknown image", "POST", "/v1.57/containers/create", `{"Image":"no-such:1","Cmd":["true"]}`, nil, 404, "No such image: no-such:1"},
			{"bad JSON", "POST", "/v1.57/containers/create", `{"Image":`, nil, 400, "invalid JSON"},
			{"huge body", "POST", "/v1.57/containers/create", big, nil, 413, "over 1048576 bytes"},
			{"bad name", "POST", "/v1.57/containers/create?name=Bad_Name", `{"Image":"bash","Cmd":["true"]}`, nil, 400, "Bad_Name"},
			{"attach stdin without OpenStdin", "POST", "/v1.57/containers/CID/attach?stream=1&stdin=1&stdout=1", "", nil, 400, "without stdin open (-i)"},
			{"attach to an exited container", "POST", "/v1.57/containers/EXITED/attach?stream=1&stdout=1", "", nil, 409, "You cannot attach to a stopped container, start it first"},
			{"resize of an exited container", "POST", "/v1.57/containers/EXITED/resize?h=10&w=10", "", nil, 409, "is not running"},
			{"unknown container", "GET", "/v1.57/containers/nope/json", "", nil, 404, "No such container: nope"},
			{"too old", "GET", "/v1.40/version", "", nil, 400, "client version 1.40 is too old. Minimum supported API version is 1.41"},
			{"too new", "GET", "/v1.58/version", "", nil, 400, "client version 1.58 is too new. Maximum supported API version is 1.57"},
			{"unknown path", "GET", "/v1.57/swarm", "", nil, 404, "page not found"},
			{"attach without upgrade", "POST", "/v1.57/containers/CID/attach?stream=1&stdout=1", "", nil, 400, "Upgrade: tcp"},
			{"exec start without upgrade", "POST", "/v1.57/exec/EID/start", `{}`, nil, 400, "Upgrade: tcp"},
			{"attach with bad detach keys", "POST", "/v1.57/containers/CID/attach?stream=1&stdout=1&detachKeys=ctrl-", "", nil, 400, "Invalid detach keys (ctrl-)"},
			{"exec with bad detach keys", "POST", "/v1.57/containers/RUNNING/exec", `{"Cmd":["true"],"DetachKeys":"ctrl-p,,"}`, nil, 400, "Invalid detach keys (ctrl-p,,)"},
			// A container's root is its Run's working directory.
			{"archive absolute path", "GET", "/v1.57/containers/RUNNING/archive?path=/etc/passwd", "", nil, 404, "Could not find the file etc/passwd"},
			{"archive /../ path", "GET", "/v1.57/containers/RUNNING/archive?path=/../etc/passwd", "", nil, 400, "must not contain '..'"},
			{"archive ../ path", "PUT", "/v1.57/containers/RUNNING/archive?path=a/../..", "", nil, 400, "must not contain '..'"},
			{"tar entry ../", "PUT", "/v1.57/containers/RUNNING/archive?path=.", tarOf(t, tarEntry{name: "../escaped", body: "x"}), nil, 400, "outside the destination"},
			{"tar entry absolute", "PUT", "/v1.57/containers/RUNNING/archive?path=.", tarOf(t, tarEntry{name: "/tmp/escaped", body: "x"}), nil, 400, "outside the destination"},
			{"tar symlink escape", "PUT", "/v1.57/containers/RUNNING/archive?path=.", tarOf(t, tarEntry{name: "l", link: "../../.."}, tarEntry{name: "l/escaped", body: "x"}), nil, 400, "outside the destination"},
			{"tar device", "PUT", "/v1.57/containers/RUNNING/archive?path=.", tarOf(t, tarEntry{name: "null", char: true}), nil, 400, "devices and FIFOs are refused"},
			{"not a tar", "PUT", "/v1.57/containers/RUNNING/archive?path=.", strings.Repeat("x", 1024), nil, 400, "not a tar"},
		} {
			if strings.Contains(tc.path, "CID") || strings.Contains(tc.path, "EID") {
				cid, eid := longRunning(t, ctx, cli)
				tc.path = strings.NewReplacer("CID", cid, "EID", eid).Replace(tc.path)
				defer func() {
					// Refused before any hijack: the exec was not started.
					insp, err := cli.ExecInspect(ctx, eid, client.ExecInspectOptions{})
					if err != nil || insp.Running {
						t.Errorf("%s: exec afterwards %+v %v", tc.name, insp, err)
					}
					_, _ = cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true})
				}()
			}
			if strings.Contains(tc.path, "EXITED") {
				cid := exited(t, ctx, cli)
				tc.path = strings.ReplaceAll(tc.path, "EXITED", cid)
				defer func() { _, _ = cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true}) }()
			}
			if strings.Contains(tc.path, "RUNNING") {
				cid, _ := longRunning(t, ctx, cli)
				tc.path = strings.ReplaceAll(tc.path, "RUNNING", cid)
				defer func() { _, _ = cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true}) }()
			}
			status, body := raw(t, tc.method, tc.path, tc.body)
			var msg struct{ Message string }
			if status != tc.status || json.Unmarshal(body, &msg) != nil || !strings.Contains(msg.Message, tc.message) {
				t.Errorf("%s: %d %.300s, want %d with a message holding %q", tc.name, status, body, tc.status, tc.message)
			}
		}
		noEscapes(t, up.DataDir)
	})
}

// testExecInspect follows an exec's inspect through its life: not
// running and no exit code before its start; running, with the pid its
// shell reports ($$), while it runs; its exit code and the same pid once
// it ended.
func testExecInspect(t *testing.T, ctx context.Context, cli *client.Client, id string) {
	t.Helper()
	ex, err := cli.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: []string{"sh", "-c", "echo $$; read l; exit 5"}, AttachStdin: true, AttachStdout: true})
	if err != nil {
		t.Fatal(err)
	}
	insp, err := cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err != nil || insp.Running || insp.ExitCode != 0 || insp.PID != 0 {
		t.Errorf("exec inspect before its start: %+v %v", insp, err)
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(pw, io.Discard, att.Reader)
		pw.CloseWithError(err)
		copied <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		t.Fatalf("the exec's shell printed %q, want its pid", line)
	}
	insp, err = cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err != nil || !insp.Running || insp.PID != pid {
		t.Errorf("exec inspect while it runs: running %v pid %d, want true and %d (%v)", insp.Running, insp.PID, pid, err)
	}
	if _, err := att.Conn.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-copied; err != nil {
		t.Fatal(err)
	}
	insp, err = cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err != nil || insp.Running || insp.ExitCode != 5 || insp.PID != pid {
		t.Errorf("exec inspect after its end: running %v exit %d pid %d, want false, 5 and %d (%v)", insp.Running, insp.ExitCode, insp.PID, pid, err)
	}
}

// noEscapes asserts that no tar entry of BadInput was written where its
// escape pointed.
func noEscapes(t *testing.T, dataDir string) {
	for _, p := range []string{filepath.Join(dataDir, "runs", "escaped"), filepath.Join(dataDir, "escaped"), filepath.Join(filepath.Dir(dataDir), "escaped"), "/tmp/escaped"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was written by a refused docker cp", p)
		}
	}
}

// runRm is `docker run --rm true`: create with AutoRemove, wait for its
// removal (asked before the start), start.
func runRm(ctx context.Context, cli *client.Client, name string) error {
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name,
		Config:     &container.Config{Image: "bash", Cmd: []string{"true"}, Labels: map[string]string{"suite": "rm"}},
		HostConfig: &container.HostConfig{AutoRemove: true}})
	if err != nil {
		return err
	}
	wait := cli.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionRemoved})
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("%s: start: %w", name, err)
	}
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 {
			return fmt.Errorf("%s: exit %d", name, res.StatusCode)
		}
	case err := <-wait.Error:
		return fmt.Errorf("%s: wait: %w", name, err)
	}
	return nil
}

// longRunning starts a container that sleeps and creates an exec in it.
func longRunning(t *testing.T, ctx context.Context, cli *client.Client) (string, string) {
	t.Helper()
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: "bash", Cmd: []string{"sleep", "600"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	ex, err := cli.ExecCreate(ctx, created.ID, client.ExecCreateOptions{Cmd: []string{"true"}, AttachStdout: true})
	if err != nil {
		t.Fatal(err)
	}
	return created.ID, ex.ID
}

// exited is a container whose task ended.
func exited(t *testing.T, ctx context.Context, cli *client.Client) string {
	t.Helper()
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: "bash", Cmd: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	wait := cli.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait.Result:
	case err := <-wait.Error:
		t.Fatal(err)
	}
	return created.ID
}

// rawDocker sends a request on the socket as it is (no client checks).
func rawDocker(dataDir string) func(t *testing.T, method, path, body string) (int, []byte) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", dockerSocket(dataDir))
		}}}
	return func(t *testing.T, method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, "http://docker"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
}

type tarEntry struct {
	name, body, link string
	char             bool
}

// tarOf is a tar of the entries, as a string body.
func tarOf(t *testing.T, entries ...tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		switch {
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e.link, 0
		case e.char:
			hdr.Typeflag, hdr.Devmajor, hdr.Devminor = tar.TypeChar, 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
