package artifact_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
)

// TestArtifactsThroughTheAPI serves a store's artifacts on the gateway's
// routes and reads them with the client and `stoke artifacts`' code.
func TestArtifactsThroughTheAPI(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	local, err := artifact.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	store := artifact.NewStore(artifact.StoreConfig{Backend: local})
	wf := artifact.Run{Namespace: "default", UID: "9e0c0e61-0000-4000-8000-000000000001", Name: "ci"}
	// The WorkflowRuns there are, by name.
	lookup := func(_ context.Context, ns, name string) (artifact.Run, error) {
		if ns == wf.Namespace && name == wf.Name {
			return wf, nil
		}
		return artifact.Run{}, errdefs.Errorf(errdefs.ErrNotFound, "workflowrun %s/%s not found", ns, name)
	}
	tarball := tarOf(t, map[string]string{"dist/": "", "dist/app.js": "console.log(1)", "dist/lib/x.js": "x"})
	a, err := store.Put(ctx, wf, "dist", bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	const token = "artifact-test-token"
	srv := httptest.NewServer(gateway.New(gateway.Config{Artifacts: artifact.Reader{Store: store, Lookup: lookup}, Token: token}))
	t.Cleanup(srv.Close)
	c, err := client.New(client.Config{Server: srv.URL, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	s := cli.Streams{Out: &out, Err: &errOut}

	t.Run("ls", func(t *testing.T) {
		if err := cli.ArtifactsList(ctx, c, "", "ci", func() time.Time { return a.Created.Add(time.Minute) }, s); err != nil {
			t.Fatal(err)
		}
		if got := out.String(); !strings.Contains(got, "NAME") || !strings.Contains(got, "dist") || !strings.Contains(got, a.Digest) || !strings.Contains(got, "60s") {
			t.Fatalf("ls printed %q", got)
		}
	})

	t.Run("get", func(t *testing.T) {
		to := filepath.Join(t.TempDir(), "out")
		if err := cli.ArtifactsGet(ctx, c, "", "ci", "dist", to, s); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(to, "dist", "lib", "x.js")); err != nil || string(b) != "x" {
			t.Fatalf("got %q %v", b, err)
		}
		if !strings.Contains(errOut.String(), "wrote 2 files of artifact dist") {
			t.Fatalf("note %q", errOut.String())
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name, wf, artifact string
			want               error
		}{
			{"no such workflowrun", "nope", "dist", errdefs.ErrNotFound},
			{"no such artifact", "ci", "nope", errdefs.ErrNotFound},
			{"a bad name", "ci", "..", errdefs.ErrInvalidArgument},
		} {
			if _, rc, err := c.OpenArtifact(ctx, "", tc.wf, tc.artifact); !errors.Is(err, tc.want) {
				if rc != nil {
					rc.Close()
				}
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
		// The server refuses a bad name too, not only the client.
		resp, err := http.Get(srv.URL + "/v1/namespaces/default/workflowruns/ci/artifacts/.hidden")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("no token: %d", resp.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/namespaces/default/workflowruns/ci/artifacts/.hidden", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("a bad name: %d", resp.StatusCode)
		}
		if _, err := c.ListArtifacts(ctx, "", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("ls of no such workflowrun: %v", err)
		}
	})

	t.Run("a damaged blob fails the get", func(t *testing.T) {
		blob := filepath.Join(dir, wf.Namespace, wf.UID, "blobs", strings.TrimPrefix(a.Digest, "sha256:"))
		stored, err := os.ReadFile(blob)
		if err != nil {
			t.Fatal(err)
		}
		damaged := bytes.Replace(stored, []byte("console.log(1)"), []byte("console.log(2)"), 1)
		if bytes.Equal(damaged, stored) {
			t.Fatal("nothing to damage")
		}
		if err := os.WriteFile(blob, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		// The same length: only the digest tells.
		to := t.TempDir()
		if err := cli.ArtifactsGet(ctx, c, "", "ci", "dist", to, s); err == nil || !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("a damaged artifact: %v", err)
		}
	})
}

// tarOf is a tar of files (name → content); names ending in "/" are
// directories, written first.
func tarOf(t testing.TB, files map[string]string) []byte {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, name := range names {
		body := files[name]
		h := &tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(body))}
		if strings.HasSuffix(name, "/") {
			h = &tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
