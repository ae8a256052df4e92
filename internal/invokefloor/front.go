package invokefloor

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/runtime/server"
)

// callTimeout is the deadline each gRPC call carries, as the gateway's do.
const callTimeout = time.Minute

// Front answers POSTs that carry the bearer token with one InvokeFunction
// call each.
type Front struct {
	token  []byte
	client pb.FunctionRuntimeClient
	next   atomic.Uint64
}

// NewFront serves calls over conn for clients that present token.
func NewFront(conn grpc.ClientConnInterface, token string) *Front {
	return &Front{token: []byte(token), client: pb.NewFunctionRuntimeClient(conn)}
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	// The gateway's parser, so that the floor does the gateway's work.
	if token, ok := httpapi.BearerToken(r.Header.Get("Authorization")); !ok || subtle.ConstantTimeCompare([]byte(token), f.token) != 1 {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	input, err := io.ReadAll(http.MaxBytesReader(w, r.Body, bounds.InvokeBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	resp, err := f.client.InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration:  &pb.FunctionRegistration{RunUid: "floor", RegistrationId: "floor"},
		InvocationId:  strconv.FormatUint(f.next.Add(1), 10),
		Input:         input,
		ContentType:   r.Header.Get("Content-Type"),
		TimeoutMillis: callTimeout.Milliseconds(),
	})
	switch {
	case status.Code(err) == codes.InvalidArgument:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", resp.GetContentType())
	_, _ = w.Write(resp.GetOutput())
}

// FrontConfig is the front process's.
type FrontConfig struct {
	// Listen is the HTTP address, Token the bearer token clients present.
	Listen, Token string
	// SocketDir, of mode 0700, holds the back's socket.
	SocketDir string
	// Self is this command's executable, which runs the back.
	Self string
	// Back is the back's worker; its Socket is set from SocketDir.
	Back BackConfig
	// BackProcs is the back's GOMAXPROCS.
	BackProcs int
}

// RunFront starts the back, serves HTTP on cfg.Listen until ctx ends and
// writes "listening <address>" to stdout once it listens.
func RunFront(ctx context.Context, cfg FrontConfig, stdout io.Writer) error {
	if cfg.Token == "" {
		return errors.New("no token")
	}
	fi, err := os.Stat(cfg.SocketDir)
	if err != nil {
		return err
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is not a directory of mode 0700 (%v)", cfg.SocketDir, fi.Mode())
	}
	cfg.Back.Socket = filepath.Join(cfg.SocketDir, "back.sock")
	back, err := startBack(cfg.Self, cfg.Back, cfg.BackProcs)
	if err != nil {
		return err
	}
	defer func() {
		_ = back.Process.Kill()
		_ = back.Wait()
	}()
	conn, err := grpc.NewClient("unix://"+cfg.Back.Socket, server.DialOptions()...)
	if err != nil {
		return err
	}
	defer conn.Close()
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: NewFront(conn, cfg.Token), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	fmt.Fprintln(stdout, "listening", lis.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		_ = srv.Close()
		<-errc
		return nil
	}
}
