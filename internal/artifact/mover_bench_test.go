package artifact_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/podcopy"
)

// BenchmarkArtifactMover: a job's 64 MiB workspace tree (16 files of
// 4 MiB of random bytes) uploaded from a pod into the local store and
// downloaded into another directory of the workspace, through the Exec
// service as the workflow engine's artifact steps do, each beside its
// floor in the same run: the same tree tarred through the same exec
// session to nothing (podcopy.Get to io.Discard), and the same tar
// extracted through it without the store (podcopy.Put from memory).
func BenchmarkArtifactMover(b *testing.B) {
	s := startPlane(b)
	ctx := context.Background()
	local, err := artifact.NewLocal(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	store := artifact.NewStore(artifact.StoreConfig{Backend: local})
	m := artifact.NewMover(store, s)
	wf := artifact.Run{Namespace: "default", UID: "be0c0e61-0000-4000-8000-000000000001", Name: "bench"}
	t := hold(b, s, "bench-hold")
	sh(b, s, t, `mkdir -p dist && for i in $(seq 10 25); do head -c 4194304 /dev/urandom > dist/f$i.bin; done`)
	x, uid, err := s.ExecRoute(t.Namespace, t.Name)
	if err != nil {
		b.Fatal(err)
	}
	pt := podcopy.Target{Exec: x, RunUID: uid, Name: t.Name}
	const size = 64 << 20
	var ups, downs int
	b.Run("upload", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			ups++
			if _, _, err := m.Upload(ctx, wf, t, artifact.Upload{Name: fmt.Sprintf("dist%d", ups), Paths: []string{"dist"}, IfNoFilesFound: artifact.NoFilesError}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tar-floor", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			if err := podcopy.Get(ctx, pt, "dist", io.Discard, 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("download", func(b *testing.B) {
		b.SetBytes(size)
		for i := range b.N {
			downs++
			if _, err := m.Download(ctx, wf, t, artifact.Download{Name: fmt.Sprintf("dist%d", 1+i%ups), Path: fmt.Sprintf("down%d", downs)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	_, rc, err := store.Get(ctx, wf, "dist1")
	if err != nil {
		b.Fatal(err)
	}
	tarball, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("untar-floor", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			downs++
			dir := fmt.Sprintf("down%d", downs)
			sh(b, s, t, "mkdir "+dir)
			if err := podcopy.Put(ctx, pt, dir, bytes.NewReader(tarball), 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
	if err := m.Release(ctx, t, true); err != nil {
		b.Fatal(err)
	}
}
