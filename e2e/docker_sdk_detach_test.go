package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// rawTTYDump is a task that prints each byte its terminal gives it, with
// its offset, one a line ("0000003 63"): raw mode, so that no key is the
// terminal's own (^Q would be its flow control).
var rawTTYDump = []string{"sh", "-c", "stty raw -echo; exec od -Ad -tx1 -w1 -v"}

// testSDKDetach sends Docker's detach keys through the SDK's hijacked
// streams, which pass every byte on (the CLI detects the keys itself):
// the server ends the attach without passing the keys to the process and
// without stopping it, a partial match followed by another byte passes
// both on, and an attach later types on into the same process (the
// offsets it prints show that the keys never reached it); `docker exec
// -it` with its own DetachKeys detaches the same way, the exec still
// running.
func testSDKDetach(t *testing.T, ctx context.Context, cli *client.Client) {
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{
		Image: "bash", Cmd: rawTTYDump, Tty: true, OpenStdin: true}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.ID
	defer func() { _, _ = cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}) }()
	if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	att, err := cli.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	// ^P then b is no detach: both go through.
	d := dumpStream{t: t, conn: att.Conn, r: att.Reader}
	if got := d.typeRead("a\x10b", 3); got != "0:61 1:10 2:62" {
		t.Errorf("attach, a ^P b: the process read %q; want 61 10 62", got)
	}
	// ^P ^Q is one: the stream ends, nothing more was read.
	d.typeDetached("\x10\x11z")
	ci, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil || !ci.Container.State.Running {
		t.Fatalf("after the detach keys the container is not running: %+v, %v", ci.Container.State, err)
	}
	// Attached again, with keys of the client's own: the same process
	// reads on from offset 3 (neither the keys nor z reached it), and
	// the default keys now pass through.
	att2, err := cli.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, DetachKeys: "ctrl-x,x"})
	if err != nil {
		t.Fatal(err)
	}
	defer att2.Close()
	d = dumpStream{t: t, conn: att2.Conn, r: att2.Reader}
	if got := d.typeRead("c\x10\x11", 3); got != "3:63 4:10 5:11" {
		t.Errorf("second attach, c ^P ^Q: the process read %q; want 63 10 11 from offset 3", got)
	}
	d.typeDetached("\x18x")

	// An exec with a TTY and keys of its own.
	ex, err := cli.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: rawTTYDump, TTY: true, AttachStdin: true, AttachStdout: true, DetachKeys: "ctrl-e"})
	if err != nil {
		t.Fatal(err)
	}
	ea, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	d = dumpStream{t: t, conn: ea.Conn, r: ea.Reader}
	if got := d.typeRead("q\x10", 2); got != "0:71 1:10" {
		t.Errorf("exec -it, q ^P: the process read %q; want 71 10", got)
	}
	d.typeDetached("\x05")
	insp, err := cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err != nil || !insp.Running {
		t.Errorf("after the detach keys the exec is not running: %+v, %v", insp, err)
	}
}

// dumpStream is a hijacked raw stream to a rawTTYDump process. Its read
// deadline only guards against a hang (a stream never closed).
type dumpStream struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func (d dumpStream) write(keys string) {
	d.t.Helper()
	if err := d.conn.SetReadDeadline(time.Now().Add(60 * time.Second)); err != nil {
		d.t.Fatal(err)
	}
	if _, err := io.WriteString(d.conn, keys); err != nil {
		d.t.Fatal(err)
	}
}

// typeRead types keys and returns the next n bytes the process read, as
// "offset:hex" pairs.
func (d dumpStream) typeRead(keys string, n int) string {
	d.t.Helper()
	d.write(keys)
	var got []string
	for range n {
		line, err := d.r.ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) != 2 {
			d.t.Fatalf("reading the process's output: %q, %v (after %q)", line, err, got)
		}
		off, _ := strconv.Atoi(f[0])
		got = append(got, strconv.Itoa(off)+":"+f[1])
	}
	return strings.Join(got, " ")
}

// typeDetached types keys that detach: the server closes the stream,
// and the process printed nothing more.
func (d dumpStream) typeDetached(keys string) {
	d.t.Helper()
	d.write(keys)
	out, err := io.ReadAll(d.r)
	if err != nil || len(out) > 0 {
		d.t.Errorf("after the detach keys %q: %q, %v; want the stream to end with nothing more", keys, out, err)
	}
}
