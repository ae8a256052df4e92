package kubegateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
)

// The ConfigMap in which the API server publishes how an aggregated API
// server recognises it: the front-proxy client CA, the allowed common
// names and the identity headers.
const (
	authConfigMapNamespace = "kube-system"
	authConfigMapName      = "extension-apiserver-authentication"
)

// frontProxy authenticates the requests the API server proxies to the
// gateway as an aggregated API (the APIService v1alpha1.gateway.stoke.dev):
// a client certificate that verifies against the front-proxy CA and
// carries an allowed common name vouches for the X-Remote-User, -Uid,
// -Group and -Extra-* headers, which the API server set from a caller it
// has authenticated and authorized. It is k8s.io/apiserver's own
// requestheader authenticator, fed from the ConfigMap as an aggregated
// API server's delegated authentication is, and follows the ConfigMap's
// changes. Without a verified certificate it authenticates no one and the
// headers are not read.
type frontProxy struct {
	ca      *dynamiccertificates.ConfigMapCAController
	headers *headerrequest.RequestHeaderAuthRequestController
	auth    authenticator.Request
}

func newFrontProxy(client kubernetes.Interface) (*frontProxy, error) {
	ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("front-proxy-ca",
		authConfigMapNamespace, authConfigMapName, "requestheader-client-ca-file", client)
	if err != nil {
		return nil, fmt.Errorf("gateway: front-proxy CA: %w", err)
	}
	h := headerrequest.NewRequestHeaderAuthRequestController(authConfigMapName, authConfigMapNamespace, client,
		"requestheader-username-headers", "requestheader-uid-headers", "requestheader-group-headers",
		"requestheader-extra-headers-prefix", "requestheader-allowed-names")
	f := func(fn func() []string) headerrequest.StringSliceProvider {
		return headerrequest.StringSliceProviderFunc(fn)
	}
	return &frontProxy{ca: ca, headers: h, auth: headerrequest.NewDynamicVerifyOptionsSecure(ca.VerifyOptions,
		f(h.AllowedClientNames), f(h.UsernameHeaders), f(h.UIDHeaders), f(h.GroupHeaders), f(h.ExtraHeaderPrefixes))}, nil
}

// load reads the ConfigMap once, so that the first proxied request finds
// it; an error (no aggregation layer, no right to read it) leaves the
// front proxy trusting no one until a later change loads it.
func (p *frontProxy) load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.ca.RunOnce(ctx); err != nil {
		return err
	}
	return p.headers.RunOnce(ctx)
}

// Run follows the ConfigMap until ctx ends.
func (p *frontProxy) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { p.ca.Run(ctx, 1) })
	wg.Go(func() { p.headers.Run(ctx, 1) })
	wg.Wait()
	return nil
}

// AuthenticateRequest implements authenticator.Request: the proxied
// caller of r; ok false when r has no client certificate (or the API
// server named no user); an error when it has one that is not the front
// proxy's.
func (p *frontProxy) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	return p.auth.AuthenticateRequest(r)
}
