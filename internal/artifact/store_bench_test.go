package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// benchTar is a tar of 16 files of 4 MiB of random bytes (64 MiB, as
// incompressible as artifacts of build output get).
func benchTar(b *testing.B) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := make([]byte, 4<<20)
	for i := range 16 {
		_, _ = rand.Read(body)
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("dist/f%02d.bin", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			b.Fatal(err)
		}
		_, _ = tw.Write(body)
	}
	_ = tw.Close()
	return buf.Bytes()
}

// BenchmarkArtifactStore: an artifact's upload (Store.Put: the entry
// checks, the SHA-256, the backend's write) and download (Store.Get read
// to its end, the digest checked) on loopback, each beside its floor in
// the same run: for the local directory, the same bytes written to one
// file and fsynced, and read back; for S3 (versitygw's posix backend on a
// loopback address, internal/artifact/s3test), one raw PutObject of the
// same bytes, and its GetObject. Each upload's bytes differ (a counter in
// the first file), so that none is found stored already.
func BenchmarkArtifactStore(b *testing.B) {
	data := benchTar(b)
	ctx := context.Background()
	for _, backend := range []string{"local", "s3"} {
		var be Backend
		var floorPut func(i int) error
		var floorGet func(i int) (io.ReadCloser, error)
		switch backend {
		case "local":
			dir := b.TempDir()
			l, err := NewLocal(filepath.Join(dir, "artifacts"))
			if err != nil {
				b.Fatal(err)
			}
			be = l
			floorPut = func(i int) error {
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("floor-%d", i)))
				if err != nil {
					return err
				}
				if _, err := f.Write(data); err != nil {
					return err
				}
				if err := f.Sync(); err != nil {
					return err
				}
				return f.Close()
			}
			floorGet = func(i int) (io.ReadCloser, error) { return os.Open(filepath.Join(dir, fmt.Sprintf("floor-%d", i))) }
		case "s3":
			s, _ := startTestS3(b)
			be = s
			floorPut = func(i int) error {
				_, err := s.c.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: aws.String(fmt.Sprintf("floor-%d", i)), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))})
				return err
			}
			floorGet = func(i int) (io.ReadCloser, error) {
				out, err := s.c.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(fmt.Sprintf("floor-%d", i))})
				if err != nil {
					return nil, err
				}
				return out.Body, nil
			}
		}
		store := NewStore(StoreConfig{Backend: be})
		run := Run{Namespace: "bench", UID: "bench-run", Name: "bench"}
		// b.Run calls each function more than once: names and floor
		// objects are counted across the calls.
		var puts, floors int
		b.Run(backend+"/upload", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for range b.N {
				puts++
				// Bytes of their own each time: the same bytes again
				// are found at their digest's key and not sent.
				binary.BigEndian.PutUint64(data[512:], uint64(puts))
				if _, err := store.Put(ctx, run, fmt.Sprintf("a%d", puts), bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(backend+"/upload-floor", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for range b.N {
				floors++
				if err := floorPut(floors); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(backend+"/download", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := range b.N {
				_, rc, err := store.Get(ctx, run, fmt.Sprintf("a%d", 1+i%puts))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, rc); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
		})
		b.Run(backend+"/download-floor", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := range b.N {
				rc, err := floorGet(1 + i%floors)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, rc); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
		})
		if err := store.DeleteRun(ctx, run); err != nil {
			b.Fatal(err)
		}
	}
}
