package up_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	dockerclient "github.com/moby/moby/client"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/docker"
	stokeexec "stoke.dev/stoke/internal/exec"
)

// BenchmarkUpThroughputDocker: ExecCat pipes 256 MiB through an exec'd
// cat, the Docker SDK's hijacked stream beside stoke's exec route; Cp64MiB
// copies a tree of 64 files of 1 MiB into a container and out of it
// (docker cp through the SDK). MiB/s one way.
func BenchmarkUpThroughputDocker(b *testing.B) {
	const size = 256 << 20
	s := startUp(b, withDocker)
	s.create(b, `{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":"target"},
 "spec":{"runtime":"bash","mode":{"task":{"args":["sleep","100000"]}}}}`)
	s.waitPhase(b, "target", v1alpha1.PhaseRunning)
	cli, err := dockerclient.New(dockerclient.WithHost("unix://"+filepath.Join(s.dataDir, "docker", "docker.sock")), dockerclient.WithAPIVersion(docker.APIVersion))
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	pattern := bytes.Repeat([]byte("0123456789abcdef"), 4<<10)
	mibPerSec := func(b *testing.B, bytes int, elapsed time.Duration) {
		b.ReportMetric(float64(bytes*b.N)/(1<<20)/elapsed.Seconds(), "MiB/s")
		b.ReportMetric(0, "ns/op")
	}

	b.Run("ExecCat/docker-sdk", func(b *testing.B) {
		var elapsed time.Duration
		for range b.N {
			start := time.Now()
			ex, err := cli.ExecCreate(ctx, "target", dockerclient.ExecCreateOptions{Cmd: []string{"cat"}, AttachStdin: true, AttachStdout: true})
			if err != nil {
				b.Fatal(err)
			}
			att, err := cli.ExecAttach(ctx, ex.ID, dockerclient.ExecAttachOptions{})
			if err != nil {
				b.Fatal(err)
			}
			go func() {
				_, _ = io.Copy(att.Conn, &patternReader{block: pattern, left: size})
				_ = att.CloseWrite()
			}()
			out := &countWriter{}
			_, err = stdcopy.StdCopy(out, io.Discard, att.Reader)
			elapsed += time.Since(start)
			att.Close()
			if err != nil || out.n != size {
				b.Fatalf("%d bytes, %v", out.n, err)
			}
		}
		mibPerSec(b, size, elapsed)
	})
	b.Run("ExecCat/stoke", func(b *testing.B) {
		c, err := client.New(client.Config{Server: s.url, Token: s.token})
		if err != nil {
			b.Fatal(err)
		}
		var elapsed time.Duration
		for range b.N {
			start := time.Now()
			sess, err := c.Exec().Start(ctx, stokeexec.Request{RunUID: "default/target", Command: []string{"cat"}, Stdin: true})
			if err != nil {
				b.Fatal(err)
			}
			out := &countWriter{}
			exit, err := sess.Stream(ctx, stokeexec.Streams{Stdin: &patternReader{block: pattern, left: size}, Stdout: out, Stderr: io.Discard})
			elapsed += time.Since(start)
			sess.Close()
			if err != nil || exit.Code != 0 || out.n != size {
				b.Fatalf("exit %+v, %v, %d bytes", exit, err, out.n)
			}
		}
		mibPerSec(b, size, elapsed)
	})

	// A tar of a tree of 64 files of 1 MiB, made once.
	const files, fileSize = 64, 1 << 20
	var tree bytes.Buffer
	tw := tar.NewWriter(&tree)
	_ = tw.WriteHeader(&tar.Header{Name: "cp/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := range files {
		_ = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("cp/f%02d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: fileSize})
		for j := 0; j < fileSize; j += len(pattern) {
			_, _ = tw.Write(pattern[:min(len(pattern), fileSize-j)])
		}
	}
	_ = tw.Close()
	b.Run("Cp64MiB/in", func(b *testing.B) {
		var elapsed time.Duration
		for range b.N {
			start := time.Now()
			if _, err := cli.CopyToContainer(ctx, "target", dockerclient.CopyToContainerOptions{DestinationPath: ".", Content: bytes.NewReader(tree.Bytes())}); err != nil {
				b.Fatal(err)
			}
			elapsed += time.Since(start)
		}
		mibPerSec(b, files*fileSize, elapsed)
	})
	b.Run("Cp64MiB/out", func(b *testing.B) {
		var elapsed time.Duration
		for range b.N {
			start := time.Now()
			res, err := cli.CopyFromContainer(ctx, "target", dockerclient.CopyFromContainerOptions{SourcePath: "cp"})
			if err != nil {
				b.Fatal(err)
			}
			tr, n := tar.NewReader(res.Content), 0
			for {
				if _, err := tr.Next(); err != nil {
					break
				}
				m, _ := io.Copy(io.Discard, tr)
				n += int(m)
			}
			res.Content.Close()
			elapsed += time.Since(start)
			if n != files*fileSize {
				b.Fatalf("%d bytes out", n)
			}
		}
		mibPerSec(b, files*fileSize, elapsed)
	})
}
