// Package debugsock serves Go's runtime profiles (net/http/pprof) on a
// Unix socket in a directory only the process's user may enter (0700), as
// containerd serves its debug socket: never on a TCP port. An operator
// reaches it from inside the container (`kubectl exec ... -- stoke debug
// pprof`), which already grants everything a profile shows.
package debugsock

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"sync"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/probe"
)

// Server serves the profiles until Close.
type Server struct {
	srv  *http.Server
	path string
	done chan struct{}
	once sync.Once
}

// Listen makes path's directory private (created if missing, then chmod
// 0700; it refuses one it cannot make so), replaces a stale socket file,
// and serves /debug/pprof/ on path until Close.
func Listen(path string) (*Server, error) {
	lis, err := probe.ListenPrivate("debug socket", path)
	if err != nil {
		return nil, err
	}
	s := &Server{
		srv: &http.Server{
			Handler:           Handler(),
			ReadHeaderTimeout: 10 * time.Second,
		},
		path: path,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis) // ErrServerClosed after Close
	}()
	return s, nil
}

// Handler is net/http/pprof's handlers under /debug/pprof/, on a mux of
// their own (never http.DefaultServeMux).
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops serving (a profile being taken is cut short) and waits for
// the server's goroutine; it is safe to call twice.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() { err = s.srv.Close() })
	<-s.done
	return err
}

// Fetch asks the process serving socket for /debug/pprof/<name> with query
// (e.g. seconds=20 for "profile") and copies the answer to w.
func Fetch(ctx context.Context, socket, name string, query url.Values, w io.Writer) error {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	defer tr.CloseIdleConnections()
	u := url.URL{Scheme: "http", Host: "stoke", Path: "/debug/pprof/" + name, RawQuery: query.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("pprof %s on %s: %w", name, socket, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("pprof %s on %s: %w", name, socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("pprof %s on %s: %s: %s", name, socket, resp.Status, msg)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, bounds.DebugProfile+1))
	if err != nil {
		return fmt.Errorf("pprof %s on %s: %w", name, socket, err)
	}
	if n > bounds.DebugProfile {
		return fmt.Errorf("pprof %s on %s: larger than %d bytes", name, socket, bounds.DebugProfile)
	}
	return nil
}

// IsSocket is whether a socket file is at path (not following a symlink):
// what a listing of debug sockets takes for one, live or stale.
func IsSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}

// Probe dials socket and hangs up: nil when a process accepts on it. A
// socket file left by a process that died without removing it (SIGKILL)
// refuses the dial.
func Probe(ctx context.Context, socket string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return err
	}
	return c.Close()
}
