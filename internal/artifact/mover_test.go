package artifact_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/podcopy"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/standalone"
	"stoke.dev/stoke/internal/testbin"
)

var stokeBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { cleanup() }))
}

// plane is standalone Stoke with one bash pod of 8 slots.
func startPlane(t testing.TB) *standalone.Standalone {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "bash", Namespace: "default"},
		Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 8}}
	s, err := standalone.New(ctx, standalone.Config{
		DataDir: t.TempDir(), Logger: log, DefaultRuntimes: []*v1alpha1.Runtime{rt},
		PodCommand:     func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(stokeBin, args...) },
		HealthInterval: 200 * time.Millisecond, StatusPoll: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("standalone: %v", err)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for len(s.Pods()) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no pod ready")
		}
		time.Sleep(10 * time.Millisecond) // polling an observable state
	}
	return s
}

// hold starts a Run holding its working directory, as the engine's
// artifact steps do, and waits until it runs.
func hold(t testing.TB, s *standalone.Standalone, name string) artifact.Target {
	t.Helper()
	run := &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: artifact.HoldCommand()}}}}
	if _, err := s.CreateRun(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, s, name, v1alpha1.PhaseRunning)
	return artifact.Target{Namespace: "default", Name: name}
}

func waitPhase(t testing.TB, s *standalone.Standalone, name string, want v1alpha1.Phase) *v1alpha1.Run {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		run, err := s.GetRun(context.Background(), "default", name)
		if err == nil && run.Status.Phase == want {
			if _, _, err := s.ExecRoute("default", name); err == nil || want != v1alpha1.PhaseRunning {
				return run
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never %s: %+v (%v)", name, want, run.Status, err)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
}

// sh runs a script in the Run (its working directory) and returns stdout.
func sh(t testing.TB, s *standalone.Standalone, tg artifact.Target, script string) string {
	t.Helper()
	x, uid, err := s.ExecRoute(tg.Namespace, tg.Name)
	if err != nil {
		t.Fatal(err)
	}
	var out podcopy.Buffer
	if err := podcopy.Script(context.Background(), podcopy.Target{Exec: x, RunUID: uid, Name: tg.Name}, script, nil, nil, &out); err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return out.String()
}

func TestMover(t *testing.T) {
	s := startPlane(t)
	ctx := context.Background()
	dir := t.TempDir()
	local, err := artifact.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	store := artifact.NewStore(artifact.StoreConfig{Backend: local, Limits: artifact.Limits{Bytes: 1 << 20}})
	m := artifact.NewMover(store, s)
	wf := artifact.Run{Namespace: "default", UID: "5d3d7a0e-0000-4000-8000-000000000001", Name: "ci"}

	up := hold(t, s, "upload")
	sh(t, s, up, `mkdir -p dist/sub logs && printf alpha > dist/a.txt && printf beta > dist/sub/b.txt && printf 1 > logs/one.log && printf 2 > logs/two.log && printf x > top.txt && ln -s /etc escape && ln -s sub dist/inside`)

	t.Run("upload", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			paths []string
			files int // entries: directories count
		}{
			// A directory's contents, named relative to it (GitHub's).
			{"dist", []string{"dist/"}, 6},
			{"globs", []string{"logs/*.log", "top.txt"}, 3},
			{"one-file", []string{"dist/sub/b.txt"}, 1},
			{"any-depth", []string{"**/*.txt"}, 3},
		} {
			a, warning, err := m.Upload(ctx, wf, up, artifact.Upload{Name: tc.name, Paths: tc.paths, IfNoFilesFound: artifact.NoFilesError})
			if err != nil || warning != "" {
				t.Fatalf("%s: %v %q", tc.name, err, warning)
			}
			if a.Files != tc.files {
				t.Errorf("%s: %d entries, want %d", tc.name, a.Files, tc.files)
			}
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			u    artifact.Upload
			want error
			text string
		}{
			{"a link out of the workspace", artifact.Upload{Name: "x1", Paths: []string{"escape"}}, errdefs.ErrInvalidArgument, "resolves outside the working directory"},
			{"a glob through it", artifact.Upload{Name: "x2", Paths: []string{"escape/host*"}}, errdefs.ErrInvalidArgument, "resolves outside the working directory"},
			{"dot-dot", artifact.Upload{Name: "x3", Paths: []string{"../x"}}, errdefs.ErrInvalidArgument, "must not contain '..'"},
			{"absolute", artifact.Upload{Name: "x4", Paths: []string{"/etc/passwd"}}, errdefs.ErrInvalidArgument, "relative"},
			{"an exclusion", artifact.Upload{Name: "x5", Paths: []string{"!dist"}}, errdefs.ErrInvalidArgument, "exclusions"},
			{"no files, error", artifact.Upload{Name: "x6", Paths: []string{"nothing/here"}, IfNoFilesFound: artifact.NoFilesError}, errdefs.ErrNotFound, "no files were found"},
			{"a name again", artifact.Upload{Name: "dist", Paths: []string{"dist"}}, errdefs.ErrAlreadyExists, "exists already"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.u.IfNoFilesFound == "" {
					tc.u.IfNoFilesFound = artifact.NoFilesWarn
				}
				_, _, err := m.Upload(ctx, wf, up, tc.u)
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
					t.Fatalf("got %v, want %v %q", err, tc.want, tc.text)
				}
			})
		}
		a, warning, err := m.Upload(ctx, wf, up, artifact.Upload{Name: "x7", Paths: []string{"nothing"}, IfNoFilesFound: artifact.NoFilesWarn})
		if err != nil || a.Digest != "" || !strings.Contains(warning, "No artifacts will be uploaded") {
			t.Fatalf("no files, warn: %+v %q %v", a, warning, err)
		}
		sh(t, s, up, `head -c 2000000 /dev/zero > big.bin`)
		if _, _, err := m.Upload(ctx, wf, up, artifact.Upload{Name: "big", Paths: []string{"big.bin"}, IfNoFilesFound: artifact.NoFilesWarn}); !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("over the bound: %v", err)
		}
		list, err := store.List(ctx, wf)
		if err != nil || len(list) != 4 {
			t.Fatalf("stored after the refusals: %+v %v", list, err)
		}
	})

	if err := m.Release(ctx, up, true); err != nil {
		t.Fatal(err)
	}
	if run := waitPhase(t, s, "upload", v1alpha1.PhaseSucceeded); run.Status.ExitCode == nil || *run.Status.ExitCode != 0 {
		t.Fatalf("released hold: %+v", run.Status)
	}

	down := hold(t, s, "download")
	t.Run("download", func(t *testing.T) {
		for _, d := range []artifact.Download{{Name: "dist", Path: "restored"}, {Name: "globs"}, {Name: "one-file", Path: "deep/er"}} {
			if _, err := m.Download(ctx, wf, down, d); err != nil {
				t.Fatalf("%s: %v", d.Name, err)
			}
		}
		got := sh(t, s, down, `cat restored/a.txt restored/sub/b.txt logs/one.log logs/two.log top.txt deep/er/b.txt; cat restored/inside/b.txt`)
		if got != "alphabeta12xbetabeta" {
			t.Fatalf("restored %q", got)
		}
	})

	t.Run("download refused", func(t *testing.T) {
		wd := strings.TrimSpace(sh(t, s, down, `pwd`))
		outside := filepath.Join(filepath.Dir(wd), "planted")
		// A blob planted in the store behind its checks: the way in checks
		// every entry again.
		evil := plant(t, dir, wf, "evil", []tar.Header{{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "../planted", Typeflag: tar.TypeReg}})
		if _, err := m.Download(ctx, wf, down, artifact.Download{Name: evil}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "outside the destination") {
			t.Fatalf("planted escape: %v", err)
		}
		if _, err := os.Stat(outside); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("written outside the workspace: %v", err)
		}
		sh(t, s, down, `ln -s / root`)
		for _, tc := range []struct {
			d    artifact.Download
			want error
		}{
			{artifact.Download{Name: "dist", Path: "root/tmp"}, errdefs.ErrInvalidArgument},
			{artifact.Download{Name: "dist", Path: "../x"}, errdefs.ErrInvalidArgument},
			{artifact.Download{Name: "nope"}, errdefs.ErrNotFound},
		} {
			if _, err := m.Download(ctx, wf, down, tc.d); !errors.Is(err, tc.want) {
				t.Errorf("%+v: %v, want %v", tc.d, err, tc.want)
			}
		}
	})
	if err := m.Release(ctx, down, false); err != nil {
		t.Fatal(err)
	}
	if run := waitPhase(t, s, "download", v1alpha1.PhaseFailed); run.Status.ExitCode == nil || *run.Status.ExitCode != 1 {
		t.Fatalf("hold released as failed: %+v", run.Status)
	}
}

// plant writes an artifact straight into a local store's directory,
// bypassing Store.Put's checks, and returns its name.
func plant(t *testing.T, dir string, wf artifact.Run, name string, hdrs []tar.Header) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		h.Size, h.Mode = 1, 0o644
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte("x"))
	}
	_ = tw.Close()
	sum := sha256.Sum256(b.Bytes())
	hexd := hex.EncodeToString(sum[:])
	runDir := filepath.Join(dir, wf.Namespace, wf.UID)
	if err := os.WriteFile(filepath.Join(runDir, "blobs", hexd), b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ := json.Marshal(artifact.Artifact{Name: name, Namespace: wf.Namespace, UID: wf.UID, Digest: "sha256:" + hexd, Size: int64(b.Len()), Files: len(hdrs)})
	if err := os.WriteFile(filepath.Join(runDir, "manifests", name+".json"), m, 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}
