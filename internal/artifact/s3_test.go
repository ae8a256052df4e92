package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"stoke.dev/stoke/internal/artifact/s3test"
	"stoke.dev/stoke/internal/errdefs"
)

// testBucket is the bucket the tests make on their server.
const testBucket = "artifacts"

// newTestS3 is the S3 backend on a real S3-compatible server: versitygw
// (internal/artifact/s3test) on a loopback address with a bucket.
func newTestS3(t *testing.T) Backend {
	t.Helper()
	b, _ := startTestS3(t)
	return b
}

func startTestS3(t testing.TB) (*S3, *s3test.Server) {
	t.Helper()
	srv := s3test.Start(t)
	if err := srv.CreateBucket(context.Background(), testBucket); err != nil {
		t.Fatal(err)
	}
	return s3On(t, srv, srv.SecretKey), srv
}

// s3On is the S3 backend on srv, signing with srv's access key and secret.
func s3On(t testing.TB, srv *s3test.Server, secret string) *S3 {
	t.Helper()
	b, err := NewS3(context.Background(), S3Config{
		Bucket: testBucket, Endpoint: srv.Endpoint, PathStyle: true, Region: s3test.Region, SpoolDir: t.TempDir(),
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider(srv.AccessKey, secret, "")),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestS3LargeArtifact stores an artifact of 20 MiB, spooled and sent in
// one PutObject signed with the SHA-256 computed while spooling (the
// server checks it), then the same bytes under a second name (one blob,
// not sent again) and an artifact over the bound (refused). It reads back
// whole; the bucket holds the one blob and two manifests, no other key;
// the spool directory is empty after each upload.
func TestS3LargeArtifact(t *testing.T) {
	ctx := context.Background()
	b, srv := startTestS3(t)
	s := NewStore(StoreConfig{Backend: b, Limits: Limits{Bytes: 32 << 20}})
	run := Run{Namespace: "default", UID: "large-run", Name: "ci"}
	spoolEmpty := func(after string) {
		t.Helper()
		if left, err := os.ReadDir(b.spool); err != nil || len(left) != 0 {
			t.Fatalf("after %s the spool directory holds %v (%v); want nothing", after, left, err)
		}
	}
	tarOf := func(size int) []byte {
		body := make([]byte, size)
		_, _ = rand.Read(body)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Name: "big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(body)
		_ = tw.Close()
		return buf.Bytes()
	}
	data := tarOf(20<<20 + 12345)
	a, err := s.Put(ctx, run, "big", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	spoolEmpty("an upload")
	again, err := s.Put(ctx, run, "same", bytes.NewReader(data))
	if err != nil || again.Digest != a.Digest {
		t.Fatalf("the same bytes again: %+v %v; want digest %s", again, err, a.Digest)
	}
	if _, err := s.Put(ctx, run, "over", bytes.NewReader(tarOf(33<<20))); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("an artifact over the bound: %v; want TooLarge", err)
	}
	spoolEmpty("a refused upload")
	for _, name := range []string{"big", "same"} {
		_, rc, err := s.Get(ctx, run, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s read back %d bytes (%v); stored %d as %s", name, len(got), err, len(data), a.Digest)
		}
	}
	out, err := srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String("stoke-artifacts/default/large-run/")})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, strings.TrimPrefix(aws.ToString(o.Key), "stoke-artifacts/default/large-run/"))
	}
	want := []string{"blobs/" + strings.TrimPrefix(a.Digest, "sha256:"), "manifests/big.json", "manifests/same.json"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %v; want %v", keys, want)
	}
}

// TestS3RefusesAWrongSecret: the server checks every request's signature,
// and the backend says PermissionDenied, storing nothing.
func TestS3RefusesAWrongSecret(t *testing.T) {
	ctx := context.Background()
	good, srv := startTestS3(t)
	bad := s3On(t, srv, "not-"+srv.SecretKey)
	run := Run{Namespace: "default", UID: "signed-run", Name: "ci"}
	_, err := NewStore(StoreConfig{Backend: bad}).Put(ctx, run, "a", bytes.NewReader(tarFiles(t, map[string]string{"a": "a"})))
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("a put signed with the wrong secret: %v; want PermissionDenied naming the signature", err)
	}
	if runs, err := good.Runs(ctx); err != nil || len(runs) != 0 {
		t.Fatalf("runs in the store after the refused put: %v %v", runs, err)
	}
}
