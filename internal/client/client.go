// Package client is a typed Go client for Stoke's HTTP API
// (docs/http-api.md): Runs (create, get, list, watch, cancel, delete, logs,
// invoke) and Runtimes (apply, get, list, watch, delete).
//
// Every call takes a context, and everything read from the server is
// bounded. An error answer becomes an *APIError that wraps the matching
// internal/errdefs category (or, for a handler failure, an
// *errdefs.FunctionError), so callers test errors.Is(err,
// errdefs.ErrNotFound) as they would inside the server. A server that
// cannot be reached is an *UnreachableError wrapping errdefs.ErrUnavailable.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Bounds on what the client reads from the server.
const (
	// MaxErrorBody bounds an error answer's body.
	MaxErrorBody = 64 << 10
	// MaxObject bounds one object, alone or as a watch event. A Run may
	// carry a 1 MiB source, which JSON escaping can grow up to six times.
	MaxObject = 16 << 20
	// MaxList bounds a list answer.
	MaxList = 256 << 20
	// MaxLogRecord bounds one log record: the server splits output into
	// lines of at most 16 KiB, which JSON escaping can grow up to six
	// times.
	MaxLogRecord = 128 << 10
)

// Config configures a Client.
type Config struct {
	// Server is the API's base URL, http:// or https://, optionally with a
	// path prefix. A bare host:port means http://host:port.
	Server string
	// Token is the bearer token sent with every request.
	Token string
	// CACertFile, if set, names a PEM file of CA certificates trusted in
	// addition to the system roots, for an https:// server with its own CA.
	CACertFile string
	// HTTPClient, if set, is used instead of one built from CACertFile. It
	// must not have a Timeout: watches and followed logs are long-lived;
	// every call is bounded by its context instead.
	HTTPClient *http.Client
	// Upgrade, if set, opens exec's WebSocket instead of a
	// websocket.Dialer built from HTTPClient's transport, as gorilla's
	// Dialer.DialContext does (its response, for a refused upgrade, is
	// read as an error answer): for a transport that authenticates on its
	// own, such as a kubeconfig's.
	Upgrade func(ctx context.Context, url string, h http.Header, subprotocols []string) (*websocket.Conn, *http.Response, error)
	// Why says how this server was chosen, for Target.
	Why string
	// Aggregated makes invoke, exec and logs use the gateway's routes as
	// the Kubernetes aggregated API (Server is then the API server's
	// URL): /apis/gateway.stoke.dev/v1alpha1/namespaces/NS/runs/NAME/
	// invoke/UID, .../exec and .../log.
	Aggregated bool
}

// Client calls one Stoke server. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	token   string
	hc      *http.Client
	upgrade func(ctx context.Context, url string, h http.Header, subprotocols []string) (*websocket.Conn, *http.Response, error)
	why     string
	// aggregated: Config.Aggregated.
	aggregated bool
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	base, err := ParseServerURL(cfg.Server)
	if err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc, err = newHTTPClient(cfg.CACertFile)
		if err != nil {
			return nil, err
		}
	}
	return &Client{base: base, token: cfg.Token, hc: hc, upgrade: cfg.Upgrade, why: cfg.Why, aggregated: cfg.Aggregated}, nil
}

// ParseServerURL checks a server URL: http or https, a host, no query. A
// bare host:port means http://host:port.
func ParseServerURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errdefs.InvalidArgument("server", "must not be empty")
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errdefs.InvalidArgument("server", "%q is not a URL: %v", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errdefs.InvalidArgument("server", "%q: the scheme must be http or https", s)
	case u.Host == "":
		return nil, errdefs.InvalidArgument("server", "%q has no host", s)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, errdefs.InvalidArgument("server", "%q: a server URL has no user, query or fragment", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

func newHTTPClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = 10 * time.Second
	// `stoke apply` sends this many creates at once; each keeps its
	// connection for the next one.
	tr.MaxIdleConnsPerHost = bounds.ApplyCreates
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA certificates: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errdefs.InvalidArgument("CA certificates", "%s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}, nil
}

// Server is the base URL the client calls.
func (c *Client) Server() string { return c.base.String() }

// url returns the server URL of an API path made of segments.
func (c *Client) url(query url.Values, segments ...string) *url.URL {
	u := c.base.JoinPath(segments...)
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	return u
}

// request is one API call.
type request struct {
	method      string
	url         *url.URL
	body        []byte
	contentType string
	header      http.Header
}

// send performs r and returns the response when its status is 2xx; any
// other status becomes an error read from the body. The caller closes the
// body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, r.url.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.method, r.url.Path, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.body != nil {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s %s: %w", r.method, r.url.Path, ctxErr)
		}
		return nil, &UnreachableError{Server: c.Server(), Err: unwrapURLError(err)}
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// unwrapURLError drops net/http's `Get "URL": ` prefix; the caller names
// the server once.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// do performs r and decodes a JSON answer of at most limit bytes into out
// (when out is not nil).
func (c *Client) do(ctx context.Context, r request, limit int64, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxErrorBody))
		return nil
	}
	b, err := readBounded(resp.Body, limit)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", r.method, r.url.Path, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", r.method, r.url.Path, err)
	}
	return nil
}

// readBounded reads r to its end, failing past limit bytes.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "the answer exceeds %d bytes", limit)
	}
	return b, nil
}

// jsonBody encodes v for a request.
func jsonBody(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	return b, nil
}
