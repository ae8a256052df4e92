package artifact

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"stoke.dev/stoke/internal/errdefs"
)

// S3Config says where an S3 backend keeps artifacts.
type S3Config struct {
	// Bucket holds them (it must exist); Prefix starts every key (default
	// "stoke-artifacts/").
	Bucket string
	Prefix string
	// Endpoint is an S3-compatible server's URL (empty: AWS's for the
	// region); PathStyle addresses the bucket in the path, as most
	// servers that are not AWS want.
	Endpoint  string
	PathStyle bool
	// Region, when empty, comes from the usual AWS configuration.
	Region string
	// Credentials come from the usual AWS chain (environment — a
	// Secret's keys as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY —,
	// shared files — a Secret mounted as AWS_SHARED_CREDENTIALS_FILE —,
	// web identity, the instance's role) unless set here.
	Credentials aws.CredentialsProvider
	// HTTPClient, when set, makes the SDK's requests.
	HTTPClient *http.Client
	// SpoolDir holds a blob while it is hashed, before it goes up (one
	// temporary file per upload in flight, at most bounds.ArtifactBytes
	// each); empty: os.TempDir().
	SpoolDir string
}

// S3 is the Backend of Kubernetes and Lambda mode: an S3-compatible
// bucket, through aws-sdk-go-v2's S3 client. Keys:
// <prefix><namespace>/<uid>/blobs/<hex> and …/manifests/<name>.json. A
// blob's digest is known only at its end, so it is spooled to a local
// file first (PutBlob); one PutObject takes up to S3's 5 GiB, over
// bounds.ArtifactBytes.
type S3 struct {
	c      *s3.Client
	bucket string
	prefix string
	spool  string
}

var _ Backend = (*S3)(nil)

// NewS3 returns the backend cfg describes.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Bucket == "" {
		return nil, errdefs.InvalidArgument("bucket", "the S3 artifact store needs a bucket")
	}
	var opts []func(*config.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.Credentials != nil {
		opts = append(opts, config.WithCredentialsProvider(cfg.Credentials))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("artifact store: AWS configuration: %w", err)
	}
	c := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// Checksums only where S3 requires them: servers that are not
		// AWS often know no CRC headers; the blob's SHA-256 is checked
		// on every read anyway.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "stoke-artifacts/"
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &S3{c: c, bucket: cfg.Bucket, prefix: prefix, spool: cfg.SpoolDir}, nil
}

func (s *S3) runPrefix(run Run) string { return s.prefix + run.Namespace + "/" + run.UID + "/" }

func (s *S3) blobKey(run Run, digest string) string {
	return s.runPrefix(run) + "blobs/" + strings.TrimPrefix(digest, "sha256:")
}

func (s *S3) manifestKey(run Run, name string) string {
	return s.runPrefix(run) + "manifests/" + name + ".json"
}

// s3Error gives an SDK error its errdefs category where one fits.
func s3Error(op, key string, err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return errdefs.Errorf(errdefs.ErrNotFound, "s3 %s %s: not found", op, key)
		case "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch":
			return errdefs.Errorf(errdefs.ErrPermissionDenied, "s3 %s %s: %s", op, key, api.ErrorMessage())
		}
	}
	if errors.Is(err, errdefs.ErrTooLarge) || errors.Is(err, errdefs.ErrInvalidArgument) {
		return err
	}
	return fmt.Errorf("s3 %s %s: %w", op, key, err)
}

// PutBlob implements Backend. The blob is spooled to a temporary file
// while it is hashed (bounded by limit), so that its digest is known
// before anything is sent: a blob already at its digest's key is not sent
// again (HEAD), and otherwise it goes up in one PutObject straight to that
// key, signed with the SHA-256 already computed. S3 writes an object whole
// or not at all, so an upload cut short leaves nothing behind. Reading the
// local file twice costs far less than the server-side copy it replaces,
// which rewrote and rehashed every byte.
func (s *S3) PutBlob(ctx context.Context, run Run, r io.Reader, limit int64) (string, int64, error) {
	tmp, err := os.CreateTemp(s.spool, "stoke-artifact-*")
	if err != nil {
		return "", 0, fmt.Errorf("artifact store: spooling a blob: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	h := newHashingReader(r, limit)
	if _, err := io.Copy(tmp, ctxReader{ctx, h}); err != nil {
		if cause := h.err; cause != nil {
			return "", 0, cause
		}
		return "", 0, fmt.Errorf("artifact store: spooling a blob: %w", err)
	}
	digest, sum := h.digest(), hex.EncodeToString(h.h.Sum(nil))
	key := s.blobKey(run, digest)
	switch _, err := s.c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key}); {
	case err == nil:
		return digest, h.n, nil // content-addressed: the same bytes are there
	case !errors.Is(s3Error("head", key, err), errdefs.ErrNotFound):
		return "", 0, s3Error("head", key, err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}
	_, err = s.c.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: tmp, ContentLength: aws.Int64(h.n)},
		s3.WithAPIOptions(knownPayloadHash(sum)))
	if err != nil {
		return "", 0, s3Error("put", key, err)
	}
	return digest, h.n, nil
}

// knownPayloadHash gives SigV4 the body's SHA-256 computed while spooling
// it, so that the SDK does not read the body a second time to hash it (it
// skips its own hashing when the context has one).
func knownPayloadHash(sum string) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Finalize.Insert(middleware.FinalizeMiddlewareFunc("StokeKnownPayloadHash",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				return next.HandleFinalize(v4.SetPayloadHash(ctx, sum), in)
			}), "ComputePayloadHash", middleware.Before)
	}
}

// OpenBlob implements Backend.
func (s *S3) OpenBlob(ctx context.Context, run Run, digest string) (io.ReadCloser, error) {
	if err := validDigest(digest); err != nil {
		return nil, err
	}
	key := s.blobKey(run, digest)
	out, err := s.c.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return nil, s3Error("get", key, err)
	}
	return out.Body, nil
}

// DeleteBlob implements Backend.
func (s *S3) DeleteBlob(ctx context.Context, run Run, digest string) error {
	if err := validDigest(digest); err != nil {
		return err
	}
	key := s.blobKey(run, digest)
	if _, err := s.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil {
		return s3Error("delete", key, err)
	}
	return nil
}

// Blobs implements Backend.
func (s *S3) Blobs(ctx context.Context, run Run) ([]string, error) {
	keys, err := s.list(ctx, s.runPrefix(run)+"blobs/", "")
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, "sha256:"+k)
	}
	return out, err
}

// putObject writes a small object in one PUT.
func (s *S3) putObject(ctx context.Context, key string, data []byte) error {
	if _, err := s.c.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))}); err != nil {
		return s3Error("put", key, err)
	}
	return nil
}

// PutManifest implements Backend.
func (s *S3) PutManifest(ctx context.Context, run Run, name string, data []byte) error {
	return s.putObject(ctx, s.manifestKey(run, name), data)
}

// maxManifest bounds a manifest read (they are a few hundred bytes).
const maxManifest = 64 << 10

// Manifest implements Backend.
func (s *S3) Manifest(ctx context.Context, run Run, name string) ([]byte, error) {
	key := s.manifestKey(run, name)
	out, err := s.c.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return nil, s3Error("get", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, maxManifest+1))
	if err == nil && len(b) > maxManifest {
		err = errdefs.Errorf(errdefs.ErrInternal, "s3 get %s: over %d bytes, not a manifest", key, maxManifest)
	}
	return b, err
}

// DeleteManifest implements Backend.
func (s *S3) DeleteManifest(ctx context.Context, run Run, name string) error {
	key := s.manifestKey(run, name)
	if _, err := s.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil {
		return s3Error("delete", key, err)
	}
	return nil
}

// Manifests implements Backend.
func (s *S3) Manifests(ctx context.Context, run Run) ([]string, error) {
	keys, err := s.list(ctx, s.runPrefix(run)+"manifests/", "")
	var out []string
	for _, k := range keys {
		if name, ok := strings.CutSuffix(k, ".json"); ok {
			out = append(out, name)
		}
	}
	return out, err
}

// list lists the keys under prefix, less the prefix; with a delimiter,
// the common prefixes instead (less the prefix and the delimiter).
func (s *S3) list(ctx context.Context, prefix, delimiter string) ([]string, error) {
	in := &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix}
	if delimiter != "" {
		in.Delimiter = &delimiter
	}
	var out []string
	for p := s3.NewListObjectsV2Paginator(s.c, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s3Error("list", prefix, err)
		}
		if delimiter != "" {
			for _, cp := range page.CommonPrefixes {
				out = append(out, strings.TrimSuffix(strings.TrimPrefix(aws.ToString(cp.Prefix), prefix), delimiter))
			}
			continue
		}
		for _, o := range page.Contents {
			out = append(out, strings.TrimPrefix(aws.ToString(o.Key), prefix))
		}
	}
	return out, nil
}

// Runs implements Backend.
func (s *S3) Runs(ctx context.Context) ([]Run, error) {
	namespaces, err := s.list(ctx, s.prefix, "/")
	if err != nil {
		return nil, err
	}
	var out []Run
	for _, ns := range namespaces {
		uids, err := s.list(ctx, s.prefix+ns+"/", "/")
		if err != nil {
			return nil, err
		}
		for _, uid := range uids {
			out = append(out, Run{Namespace: ns, UID: uid})
		}
	}
	return out, nil
}

// DeleteRun implements Backend: every key under the run's prefix, 1000
// to a DeleteObjects call (S3's most).
func (s *S3) DeleteRun(ctx context.Context, run Run) error {
	prefix := s.runPrefix(run)
	keys, err := s.list(ctx, prefix, "")
	if err != nil {
		return err
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		objs := make([]types.ObjectIdentifier, 0, n)
		for _, k := range keys[:n] {
			objs = append(objs, types.ObjectIdentifier{Key: aws.String(prefix + k)})
		}
		out, err := s.c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &s.bucket, Delete: &types.Delete{Objects: objs, Quiet: aws.Bool(true)}})
		if err != nil {
			return s3Error("delete", prefix, err)
		}
		if len(out.Errors) > 0 {
			e := out.Errors[0]
			return fmt.Errorf("s3 delete %s: %d keys not deleted, the first %s: %s", prefix, len(out.Errors), aws.ToString(e.Key), aws.ToString(e.Message))
		}
		keys = keys[n:]
	}
	return nil
}
