package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
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
		Bucket: testBucket, Endpoint: srv.Endpoint, PathStyle: true, Region: s3test.Region,
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider(srv.AccessKey, secret, "")),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestS3MultipartArtifact stores an artifact over one part (8 MiB), so
// that it goes up as a multipart upload to a temporary key and is copied
// to its digest's key; it reads back whole, and nothing is left under
// uploads/.
func TestS3MultipartArtifact(t *testing.T) {
	ctx := context.Background()
	b, srv := startTestS3(t)
	s := NewStore(StoreConfig{Backend: b})
	run := Run{Namespace: "default", UID: "multipart-run", Name: "ci"}
	body := make([]byte, 2*s3PartSize+12345)
	_, _ = rand.Read(body)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write(body)
	_ = tw.Close()
	a, err := s.Put(ctx, run, "big", bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err := s.Get(ctx, run, "big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, buf.Bytes()) {
		t.Fatalf("read back %d bytes (%v); stored %d as %s", len(got), err, buf.Len(), a.Digest)
	}
	out, err := srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String("stoke-artifacts/default/multipart-run/uploads/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Contents) != 0 {
		t.Fatalf("temporary keys left: %d, the first %s", len(out.Contents), aws.ToString(out.Contents[0].Key))
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
