package up_test

import (
	"context"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	dockerclient "github.com/moby/moby/client"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/docker"
	stokeexec "stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/up"
)

// The Docker API's figures (issue 21), each beside stoke's own command in
// the same run, against one `stoke up` in this process with real pods.

func withDocker(cfg *up.Config) {
	cfg.DockerSocket = filepath.Join(cfg.DataDir, "docker", "docker.sock")
}

// BenchmarkUpDocker: RunRm is the whole CLI process, `docker run --rm bash
// true` beside `stoke run --rm --runtime bash -- true`; ExecRoundTrip one
// byte through an exec'd cat, the Docker SDK's hijacked stream beside
// stoke's exec route (BenchmarkUpExecRoundTrip's).
func BenchmarkUpDocker(b *testing.B) {
	dockerBin, err := exec.LookPath("docker")
	if err != nil {
		b.Fatal("no Docker CLI on PATH (Debian: apt-get install docker.io)")
	}
	s := startUp(b, withDocker)
	host := "unix://" + filepath.Join(s.dataDir, "docker", "docker.sock")
	env := []string{"STOKE_SERVER=" + s.url, "STOKE_TOKEN=" + s.token, "HOME=" + b.TempDir(), "DOCKER_HOST=" + host, "DOCKER_CONFIG=" + b.TempDir(), "PATH=" + os.Getenv("PATH")}
	runCmd := func(name string, args ...string) func() {
		return func() {
			cmd := exec.Command(name, args...)
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%s: %v: %s", name, err, out)
			}
		}
	}
	b.Run("RunRm/docker", func(b *testing.B) { measureCalls(b, 5, runCmd(dockerBin, "run", "--rm", "bash", "true")) })
	b.Run("RunRm/stoke", func(b *testing.B) {
		measureCalls(b, 5, runCmd(stokeBin, "run", "--rm", "--runtime", "bash", "--", "true"))
	})

	s.create(b, `{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":"target"},
 "spec":{"runtime":"bash","mode":{"task":{"args":["sleep","100000"]}}}}`)
	s.waitPhase(b, "target", v1alpha1.PhaseRunning)
	b.Run("ExecRoundTrip/docker-sdk", func(b *testing.B) {
		cli, err := dockerclient.New(dockerclient.WithHost(host), dockerclient.WithAPIVersion(docker.APIVersion))
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Close()
		ctx := context.Background()
		ex, err := cli.ExecCreate(ctx, "target", dockerclient.ExecCreateOptions{Cmd: []string{"cat"}, AttachStdin: true, AttachStdout: true})
		if err != nil {
			b.Fatal(err)
		}
		att, err := cli.ExecAttach(ctx, ex.ID, dockerclient.ExecAttachOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer att.Close()
		// The multiplexed stream: each of cat's writes is a frame, an
		// 8-byte header and its bytes.
		var hdr [8]byte
		payload := make([]byte, 64)
		roundTrips(b, func() {
			if _, err := att.Conn.Write([]byte{'x'}); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(att.Reader, hdr[:]); err != nil {
				b.Fatal(err)
			}
			n := binary.BigEndian.Uint32(hdr[4:])
			if hdr[0] != 1 || n != 1 {
				b.Fatalf("frame header %v", hdr)
			}
			if _, err := io.ReadFull(att.Reader, payload[:n]); err != nil {
				b.Fatal(err)
			}
		})
		_ = att.CloseWrite()
	})
	b.Run("ExecRoundTrip/stoke", func(b *testing.B) {
		c, err := client.New(client.Config{Server: s.url, Token: s.token})
		if err != nil {
			b.Fatal(err)
		}
		sess, err := c.Exec().Start(context.Background(), stokeexec.Request{RunUID: "default/target", Command: []string{"cat"}, Stdin: true})
		if err != nil {
			b.Fatal(err)
		}
		defer sess.Close()
		inR, inW := io.Pipe()
		out := make(byteSignal, 1)
		done := make(chan error, 1)
		go func() {
			_, err := sess.Stream(context.Background(), stokeexec.Streams{Stdin: inR, Stdout: out, Stderr: io.Discard})
			done <- err
		}()
		roundTrips(b, func() {
			if _, err := inW.Write([]byte{'x'}); err != nil {
				b.Fatal(err)
			}
			if got := <-out; len(got) != 1 {
				b.Fatalf("read back %q", got)
			}
		})
		inW.Close()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	})
}

// roundTrips warms up, then times b.N calls of one.
func roundTrips(b *testing.B, one func()) {
	for range 100 {
		one()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		one()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	report(b, lat)
}
