// Package s3test starts a real S3-compatible server for tests: versitygw
// (pinned in tools/s3/go.mod, built and cached by internal/testdeps) with
// its posix backend, on a loopback address of its own, in a mode-0700 data
// directory, with a key pair made for the one server. The keys reach
// versitygw through its environment (ROOT_ACCESS_KEY_ID and
// ROOT_SECRET_ACCESS_KEY), never its arguments; it checks every request's
// SigV4 signature against them and refuses the rest.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/testdeps"
)

// Region is the region versitygw is told it serves, and the one clients
// sign for.
const Region = "us-east-1"

// Server is a running versitygw.
type Server struct {
	// Endpoint is its URL (http://127.x.y.z:PORT), for path-style
	// addressing.
	Endpoint string
	// AccessKey and SecretKey are its root account's keys.
	AccessKey, SecretKey string
	// Dir is the posix backend's root: each bucket is a directory in it.
	Dir string

	p    *proc.Process
	logs *logBuffer
}

// startTimeout bounds versitygw's start, a cold one on a loaded machine
// included.
const startTimeout = 60 * time.Second

// Start builds versitygw if the cache does not hold it, starts it with a
// key pair made for it and waits until it answers; the test's cleanup
// stops it and removes its data. A failure to start fails the test (never
// skips it).
func Start(t testing.TB) *Server { t.Helper(); return StartWith(t, Options{}) }

// Options change how Start starts versitygw.
type Options struct {
	// AccessKey and SecretKey, when set, are its root account's keys:
	// for a test whose processes take one AWS key pair from their
	// environment for every AWS service (S3 and the Lambda simulator).
	AccessKey, SecretKey string
}

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := testdeps.S3Path()
	if err != nil {
		t.Fatal(err)
	}
	s, err := start(bin, t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.p.Kill(5 * time.Second)
		if t.Failed() {
			t.Logf("versitygw's output:\n%s", s.logs.String())
		}
	})
	return s
}

func start(bin, tmp string, opts Options) (*Server, error) {
	// The data directory is private to the test's user; versitygw makes
	// buckets and objects inside it.
	dir := filepath.Join(tmp, "s3")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, AccessKey: opts.AccessKey, SecretKey: opts.SecretKey}
	if s.AccessKey == "" {
		s.AccessKey = "STOKE" + strings.ToUpper(randomHex(8))
	}
	if s.SecretKey == "" {
		s.SecretKey = randomHex(20)
	}
	var err error
	for range 3 { // a port found free may be taken before versitygw binds it
		if err = s.startOnce(bin); err == nil || !errors.Is(err, errExited) {
			return s, err
		}
	}
	return nil, err
}

var errExited = errors.New("versitygw exited at start")

func (s *Server) startOnce(bin string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "posix", s.Dir)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + s.Dir,
		"VGW_PORT=" + addr,
		"VGW_REGION=" + Region,
		"ROOT_ACCESS_KEY_ID=" + s.AccessKey,
		"ROOT_SECRET_ACCESS_KEY=" + s.SecretKey,
	}
	s.logs = &logBuffer{}
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	p, err := proc.Start(cmd)
	if err != nil {
		return fmt.Errorf("starting versitygw: %w", err)
	}
	s.p, s.Endpoint = p, "http://"+addr
	if err := s.awaitAnswer(); err != nil {
		p.Kill(time.Second)
		return err
	}
	return nil
}

// awaitAnswer asks until versitygw answers HTTP (it says nothing when it
// listens), it exits, or startTimeout passes.
func (s *Server) awaitAnswer() error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := hc.Get(s.Endpoint + "/")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil // any answer: an anonymous request is refused, as it must be
		}
		select {
		case <-s.p.Done():
			return fmt.Errorf("%w: %s", errExited, s.logs.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("versitygw did not answer on %s within %s: %s", s.Endpoint, startTimeout, s.logs.String())
		}
	}
}

// Client is an S3 client of the server, signing with its keys.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	})
}

// CreateBucket makes a bucket through the S3 API, so that versitygw
// records its owner as it does for S3 clients' own buckets.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}

// Exited returns a channel closed if versitygw exits.
func (s *Server) Exited() <-chan struct{} { return s.p.Done() }

// freeAddr finds a free port on a loopback address of its own (127.x.y.z),
// so that servers started at the same time by parallel tests do not take
// each other's ports between the find and the bind.
func freeAddr() (string, error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	ip := net.IPv4(127, b[0], b[1], 1+b[2]%254).String()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// logBuffer keeps versitygw's output, up to logKeep bytes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const logKeep = 64 << 10

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := logKeep - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
