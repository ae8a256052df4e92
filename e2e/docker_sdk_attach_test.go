package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// testSDKAttach attaches to a container's main process with the Go SDK
// before it starts, as `docker run -i` does: stdin to its EOF (StdinOnce
// closes the process's stdin), stdout and stderr apart in the multiplexed
// framing, and its exit through wait; then with a TTY: one raw stream, a
// resize seen by `stty size`, and what the task wrote before the attach
// joined it.
func testSDKAttach(t *testing.T, ctx context.Context, cli *client.Client) {
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{
		Image: "bash", Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done >&2; exit 6"},
		OpenStdin: true, StdinOnce: true, AttachStdin: true, AttachStdout: true, AttachStderr: true}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.ID
	defer func() { _, _ = cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}) }()
	att, err := cli.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	wait := cli.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
	if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(att.Conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if err := att.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, att.Reader); err != nil {
		t.Fatalf("attach stream: %v", err)
	}
	if out.String() != "HELLO\n" || errOut.String() != "done\n" {
		t.Errorf("attach: stdout %q, stderr %q; want HELLO, done", out.String(), errOut.String())
	}
	select {
	case res := <-wait.Result:
		if res.StatusCode != 6 {
			t.Errorf("wait: %d, want 6", res.StatusCode)
		}
	case err := <-wait.Error:
		t.Fatal(err)
	}

	// With a TTY; the task writes before anyone attaches.
	created, err = cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{
		Image: "bash", Cmd: []string{"sh", "-c", "echo early; read l; stty size; exit 2"},
		Tty: true, OpenStdin: true}})
	if err != nil {
		t.Fatal(err)
	}
	tid := created.ID
	defer func() { _, _ = cli.ContainerRemove(ctx, tid, client.ContainerRemoveOptions{Force: true}) }()
	if _, err := cli.ContainerStart(ctx, tid, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerResize(ctx, tid, client.ContainerResizeOptions{Height: 21, Width: 77}); err != nil {
		t.Fatal(err)
	}
	att, err = cli.ContainerAttach(ctx, tid, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if mt, _ := att.MediaType(); mt != "application/vnd.docker.raw-stream" {
		t.Errorf("media type %q, want the raw stream", mt)
	}
	// The line it wrote before this attach joined it comes first; then
	// a line typed is echoed and read.
	first, err := att.Reader.ReadString('\n')
	if err != nil || first != "early\r\n" {
		t.Fatalf("tty attach: first line %q, %v; want early", first, err)
	}
	if _, err := io.WriteString(att.Conn, "go\r"); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(att.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(string(raw), "\r\n", "\n"); got != "go\n21 77\n" {
		t.Errorf("tty attach: %q, want the echoed go and 21 77", got)
	}
	ci, err := cli.ContainerInspect(ctx, tid, client.ContainerInspectOptions{})
	if err != nil || ci.Container.State.ExitCode != 2 || !ci.Container.Config.Tty {
		t.Errorf("inspect: exit %d tty %v, %v", ci.Container.State.ExitCode, ci.Container.Config.Tty, err)
	}
}
