package docker

import (
	"bytes"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/events"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		path, version, rest string
		status              int
	}{
		{"/_ping", APIVersion, "/_ping", 0},
		{"/v1.41/containers/json", "1.41", "/containers/json", 0},
		{"/v1.57/version", "1.57", "/version", 0},
		{"/v1.40/version", "", "", http.StatusBadRequest},
		{"/v1.58/version", "", "", http.StatusBadRequest},
		{"/v2.0/version", "", "", http.StatusBadRequest},
		{"/v1/version", "", "", http.StatusBadRequest},
	} {
		v, rest, err := negotiate(tc.path)
		if tc.status != 0 {
			if err == nil || errdefs.HTTPStatus(err) != tc.status {
				t.Errorf("%s: err %v, want status %d", tc.path, err, tc.status)
			}
			continue
		}
		if err != nil || v != tc.version || rest != tc.rest {
			t.Errorf("%s: %q %q %v, want %q %q", tc.path, v, rest, err, tc.version, tc.rest)
		}
	}
}

// The framing is what stdcopy, the SDK's reader, takes apart, also for
// writes larger than one frame.
func TestFramingRoundTrip(t *testing.T) {
	var wire bytes.Buffer
	stdout, stderr := newFramed(&wire)
	big := bytes.Repeat([]byte("x"), 3*bounds.ExecFrame+5)
	for _, w := range []struct {
		to   interface{ Write([]byte) (int, error) }
		data []byte
	}{{stdout, []byte("one\n")}, {stderr, []byte("err\n")}, {stdout, big}} {
		if n, err := w.to.Write(w.data); err != nil || n != len(w.data) {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, &wire); err != nil {
		t.Fatal(err)
	}
	if want := append([]byte("one\n"), big...); !bytes.Equal(out.Bytes(), want) || errOut.String() != "err\n" {
		t.Errorf("stdout %d bytes, stderr %q", out.Len(), errOut.String())
	}
}

func TestImages(t *testing.T) {
	im := DefaultImages()
	for ref, runtime := range map[string]string{
		"python:3": "python", "python": "python", "docker.io/library/python:3.12-slim": "python",
		"bash": "bash", "debian:bookworm": "bash", "ubuntu:24.04": "bash", "alpine": "bash", "busybox:latest": "bash",
	} {
		rule, _, err := im.Resolve(ref)
		if err != nil || rule.Runtime != runtime {
			t.Errorf("%s: %v %v, want %s", ref, rule.Runtime, err, runtime)
		}
	}
	for _, ref := range []string{"nginx", "ghcr.io/x/python:3", "pythonista:1"} {
		if _, _, err := im.Resolve(ref); errdefs.HTTPStatus(err) != http.StatusNotFound || !strings.Contains(err.Error(), "No such image") {
			t.Errorf("%s: %v, want No such image", ref, err)
		}
	}
	rule, _, _ := im.Resolve("python:3")
	if args, err := rule.taskArgs([]string{"python3", "-c", "x"}); err != nil || strings.Join(args, " ") != "-c x" {
		t.Errorf("python args: %q %v", args, err)
	}
	if _, err := rule.taskArgs([]string{"sh", "-c", "x"}); errdefs.HTTPStatus(err) != http.StatusBadRequest {
		t.Errorf("sh on python: %v, want 400", err)
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "SIGTERM": syscall.SIGTERM, "hup": syscall.SIGHUP, "9": syscall.SIGKILL} {
		if got, err := parseSignal(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"NOPE", "0", "65", "-1"} {
		if _, err := parseSignal(in); errdefs.HTTPStatus(err) != http.StatusBadRequest {
			t.Errorf("%q: %v, want 400", in, err)
		}
	}
}

func TestFilters(t *testing.T) {
	c := &ctr{id: "abcdef", name: "web", meta: meta{Labels: map[string]string{"a": "1"}}}
	for raw, want := range map[string]bool{
		`{"label":["a=1"]}`: true, `{"label":["a"]}`: true, `{"label":["a=2"]}`: false,
		`{"name":["we"]}`: true, `{"id":["abc"]}`: true, `{"status":["created"]}`: true, `{"status":{"exited":true}}`: false,
	} {
		f, err := parseFilters(raw)
		if err != nil || f.match(c) != want {
			t.Errorf("%s: %v %v, want %v", raw, f.match(c), err, want)
		}
	}
	if _, err := parseFilters(`{"nope":["x"]}`); errdefs.HTTPStatus(err) != http.StatusBadRequest {
		t.Errorf("unknown filter: %v", err)
	}
}

// TestEventLogKeepsTheLastEvents: the log holds the last
// bounds.DockerEvents events in order; a reader whose next event was
// overwritten is told so.
func TestEventLogKeepsTheLastEvents(t *testing.T) {
	l := newEventLog()
	total := bounds.DockerEvents + 5
	for i := range total {
		l.publish(events.Message{TimeNano: int64(i)})
	}
	msgs, next, _, lost := l.read(0)
	if !lost || next != uint64(total) || len(msgs) != bounds.DockerEvents || msgs[0].TimeNano != 5 || msgs[len(msgs)-1].TimeNano != int64(total-1) {
		t.Fatalf("read(0): %d events from %d, next %d, lost %v", len(msgs), msgs[0].TimeNano, next, lost)
	}
	msgs, next2, changed, lost := l.read(next)
	if lost || next2 != next || len(msgs) != 0 {
		t.Fatalf("read(next): %d events, next %d, lost %v", len(msgs), next2, lost)
	}
	l.publish(events.Message{TimeNano: -1})
	select {
	case <-changed:
	default:
		t.Fatal("publish did not wake the reader")
	}
	if msgs, _, _, _ := l.read(next); len(msgs) != 1 || msgs[0].TimeNano != -1 {
		t.Fatalf("after a publish: %+v", msgs)
	}
}
