package artifact

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// The S3 stand-in's one key pair.
const (
	testAccessKey = "STOKETESTACCESSKEY"
	testSecretKey = "stoke-test-secret-key"
)

// newTestS3 is the S3 backend on gofakes3 (an S3 server in memory) on a
// loopback port, with a bucket. gofakes3 checks no signature, so the
// handler in front of it refuses a request that does not sign with the
// test's access key: the socket takes no anonymous caller.
func newTestS3(t *testing.T) Backend {
	t.Helper()
	b, _ := startTestS3(t)
	return b
}

func startTestS3(t testing.TB) (*S3, *httptest.Server) {
	t.Helper()
	fake := gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true))
	h := fake.Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Authorization"), "Credential="+testAccessKey+"/") {
			http.Error(w, "unsigned", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	b, err := NewS3(context.Background(), S3Config{
		Bucket: "artifacts", Endpoint: srv.URL, PathStyle: true, Region: "us-east-1",
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider(testAccessKey, testSecretKey, "")),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, srv
}
