package kubegateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/logging"
)

// MaxDecisionTTL is the longest a decision is kept: a removed RoleBinding
// takes effect within it.
const MaxDecisionTTL = 10 * time.Second

// reviewTimeout bounds one TokenReview or SubjectAccessReview.
const reviewTimeout = 5 * time.Second

// AuthConfig configures the Authorizer.
type AuthConfig struct {
	// Client makes the reviews with the gateway's own credentials.
	Client kubernetes.Interface
	// TTL is how long a decision is kept (default and most:
	// MaxDecisionTTL).
	TTL time.Duration
	// Size bounds each of the two caches (default bounds.AuthCache).
	Size int
	// Clock is the caches' clock (tests move it; default the real one).
	Clock cache.Clock
	// Audiences, when set, are the audiences a caller's token must be
	// for: they are asked for in the TokenReview, and a token the API
	// server authenticates for none of them is refused (401). Empty: the
	// API server's own audiences, as kubectl's tokens have.
	Audiences []string
	// FrontProxy, when set, authenticates the callers the API server
	// proxies to the gateway as an aggregated API, from the identity
	// headers of a request whose client certificate is the front proxy's
	// (frontProxy); a request without a client certificate is
	// authenticated by its bearer token.
	FrontProxy authenticator.Request
	Logger     *slog.Logger
}

// Authorizer is the Kubernetes gateway's gateway.Authorizer. A caller is
// authenticated either by the API server before it proxied the request
// (AuthConfig.FrontProxy: the aggregated API's path) or by its bearer
// token, with a TokenReview; either way its access is authorized with a
// SubjectAccessReview made by the gateway. The answers, yes or no, are
// kept for the TTL in bounded LRU caches keyed by the token's SHA-256
// (never the token) or by the SHA-256 of the proxied user's name, UID,
// groups and extras; concurrent misses for one key make one review
// (singleflight). A review that fails (the API server unreachable) is not
// kept: the request is 503.
type Authorizer struct {
	cfg       AuthConfig
	log       *slog.Logger
	users     *cache.LRUExpireCache // tokenKey → userEntry
	decisions *cache.LRUExpireCache // decisionKey → error (nil: allowed)
	flights   *singleflight.Group
	// clientCerts: FrontProxy authenticates client certificates
	// (WithClientCertificates), not the API server's front proxy.
	clientCerts bool
	lookups     *prometheus.CounterVec
}

// tokenKey is the SHA-256 of a bearer token, or of a proxied user
// (userKey).
type tokenKey [sha256.Size]byte

type decisionKey struct {
	subject tokenKey
	access  gateway.Access
}

// userEntry is a TokenReview's answer: the user, or the refusal.
type userEntry struct {
	user authnv1.UserInfo
	err  error
}

// NewAuthorizer returns the Authorizer; its cache counters are
// Collector().
func NewAuthorizer(cfg AuthConfig) *Authorizer {
	if cfg.TTL <= 0 || cfg.TTL > MaxDecisionTTL {
		cfg.TTL = MaxDecisionTTL
	}
	if cfg.Size <= 0 {
		cfg.Size = bounds.AuthCache
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	return &Authorizer{
		cfg: cfg, log: logging.OrDiscard(cfg.Logger),
		users:     cache.NewLRUExpireCacheWithClock(cfg.Size, cfg.Clock),
		decisions: cache.NewLRUExpireCacheWithClock(cfg.Size, cfg.Clock),
		flights:   &singleflight.Group{},
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stoke_gateway_auth_cache_lookups_total",
			Help: "Lookups in the gateway's authentication (cache=token) and authorization (cache=access) caches, by result (hit, miss).",
		}, []string{"cache", "result"}),
	}
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// WithClientCertificates is an Authorizer sharing a's caches, reviews
// and counters that authenticates a caller by a client certificate certs
// verifies (the Docker port's: one the cluster's client CA signed, its
// common name the user and its organisations the groups, as the API
// server's own x509 authentication) or by its bearer token; a's front
// proxy is not trusted there. One user's decisions are one cache entry
// however the user was authenticated.
func (a *Authorizer) WithClientCertificates(certs authenticator.Request) *Authorizer {
	b := *a
	b.cfg.FrontProxy, b.clientCerts = certs, true
	return &b
}

// Collector is the cache's hit and miss counters.
func (a *Authorizer) Collector() prometheus.Collector { return a.lookups }

// Authorize implements gateway.Authorizer.
func (a *Authorizer) Authorize(r *http.Request, access gateway.Access) error {
	var certErr error
	if a.cfg.FrontProxy != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		resp, ok, err := a.cfg.FrontProxy.AuthenticateRequest(r)
		switch {
		case err != nil:
			// Not the front proxy's: its headers say nothing; a bearer
			// token may still.
			certErr = err
		case ok:
			if access == (gateway.Access{}) {
				return nil
			}
			u := userInfo(resp.User)
			return a.authorize(r.Context(), decisionKey{subject: userKey(u), access: access}, u)
		}
	}
	token, err := gateway.BearerToken(r)
	if err != nil {
		switch {
		case certErr != nil && errors.Is(err, errdefs.ErrUnauthenticated):
			return errdefs.Errorf(errdefs.ErrUnauthenticated, "no bearer token, and the client certificate is not one this port trusts: %v", certErr)
		case a.clientCerts && errors.Is(err, errdefs.ErrUnauthenticated):
			return errdefs.Errorf(errdefs.ErrUnauthenticated, "no client certificate and no bearer token: give a certificate of the cluster's client CA (DOCKER_CERT_PATH) or a token")
		}
		return err
	}
	key := tokenKey(sha256.Sum256([]byte(token)))
	user, err := a.authenticate(r.Context(), key, token)
	if err != nil || access == (gateway.Access{}) {
		return err
	}
	return a.authorize(r.Context(), decisionKey{subject: key, access: access}, user)
}

// userInfo is a proxied user as a review names it.
func userInfo(u user.Info) authnv1.UserInfo {
	out := authnv1.UserInfo{Username: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups()}
	if extra := u.GetExtra(); len(extra) > 0 {
		out.Extra = make(map[string]authnv1.ExtraValue, len(extra))
		for k, v := range extra {
			out.Extra[k] = authnv1.ExtraValue(v)
		}
	}
	return out
}

// userKey is the cache key of a proxied user's decisions: everything a
// SubjectAccessReview is asked about them, so that two users differing
// in any of it never share an answer. It cannot meet a token's key: the
// hashed bytes hold a NUL, which no header value (so no token) carries.
func userKey(u authnv1.UserInfo) tokenKey {
	b, _ := json.Marshal(u) // of strings only: it cannot fail; map keys sorted
	return tokenKey(sha256.Sum256(append([]byte("stoke-proxied-user\x00"), b...)))
}

// authenticate is the token's user, from the cache or a TokenReview.
func (a *Authorizer) authenticate(ctx context.Context, key tokenKey, token string) (authnv1.UserInfo, error) {
	if v, ok := a.users.Get(key); ok {
		a.lookups.WithLabelValues("token", "hit").Inc()
		e := v.(userEntry)
		return e.user, e.err
	}
	a.lookups.WithLabelValues("token", "miss").Inc()
	v, err, _ := a.flights.Do("t"+string(key[:]), func() (any, error) {
		// A miss may reach here after another caller's flight for the
		// same token ended and filled the cache.
		if v, ok := a.users.Get(key); ok {
			return v, nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		tr, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx,
			&authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.cfg.Audiences}}, metav1.CreateOptions{})
		if err != nil {
			// The client's error names no token; it is not kept.
			a.log.Warn("gateway: a TokenReview failed", "error", err)
			return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "cannot authenticate the caller now: the API server's TokenReview failed"), time.Second)
		}
		e := userEntry{user: tr.Status.User}
		switch {
		case !tr.Status.Authenticated:
			e.err = errdefs.Errorf(errdefs.ErrUnauthenticated, "the bearer token is not valid: the API server does not authenticate it")
		case len(a.cfg.Audiences) > 0 && !slices.ContainsFunc(tr.Status.Audiences, func(aud string) bool { return slices.Contains(a.cfg.Audiences, aud) }):
			// The API server answers with the asked audiences the token
			// is for; an authenticator that ignores audiences answers none.
			e.err = errdefs.Errorf(errdefs.ErrUnauthenticated, "the bearer token is not for this gateway's audiences")
		}
		a.users.Add(key, e, a.cfg.TTL)
		return e, nil
	})
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	e := v.(userEntry)
	return e.user, e.err
}

// authorize is the user's decision on the access. An access to one
// object by name is first asked without the name: a yes there is a yes
// for every name in the namespace (RBAC allows a name-less request only
// by a rule without resourceNames, which allows every name; the API
// server reads a name-less request, a list or a create, so too), kept
// once for the user rather than once per name, so that the first call
// of a Function the caller has not called within the TTL (a new
// Function's, a scale from zero's) waits for no review. A no there, as a
// rule limited by resourceNames gives, asks again with the name.
func (a *Authorizer) authorize(ctx context.Context, key decisionKey, user authnv1.UserInfo) error {
	if key.access.Resource != "" && key.access.Name != "" {
		every := key
		every.access.Name = ""
		err := a.decide(ctx, every, user)
		if err == nil || !errors.Is(err, errdefs.ErrPermissionDenied) {
			return err
		}
	}
	return a.decide(ctx, key, user)
}

// decide is the user's decision on exactly the access, from the cache or
// a SubjectAccessReview.
func (a *Authorizer) decide(ctx context.Context, key decisionKey, user authnv1.UserInfo) error {
	if v, ok := a.decisions.Get(key); ok {
		a.lookups.WithLabelValues("access", "hit").Inc()
		if v == nil {
			return nil
		}
		return v.(error)
	}
	a.lookups.WithLabelValues("access", "miss").Inc()
	acc := key.access
	flight := fmt.Sprintf("a%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%s", key.subject[:], acc.Verb, acc.Resource, acc.Subresource, acc.Namespace, acc.Name, acc.Path)
	v, err, _ := a.flights.Do(flight, func() (any, error) {
		if v, ok := a.decisions.Get(key); ok {
			return v, nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		sar, err := a.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, subjectAccessReview(user, acc), metav1.CreateOptions{})
		if err != nil {
			a.log.Warn("gateway: a SubjectAccessReview failed", "user", user.Username, "error", err)
			return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "cannot authorize the caller now: the API server's SubjectAccessReview failed"), time.Second)
		}
		var decision error
		if !sar.Status.Allowed || sar.Status.Denied {
			decision = errdefs.Errorf(errdefs.ErrPermissionDenied, "%s", forbidden(user.Username, acc, sar.Status.Reason))
		}
		a.decisions.Add(key, decision, a.cfg.TTL)
		return decision, nil
	})
	if err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	return v.(error)
}

// subjectAccessReview asks whether user may do acc: on a stoke.dev
// resource, or a non-resource path.
func subjectAccessReview(user authnv1.UserInfo, acc gateway.Access) *authzv1.SubjectAccessReview {
	spec := authzv1.SubjectAccessReviewSpec{User: user.Username, UID: user.UID, Groups: user.Groups}
	if len(user.Extra) > 0 {
		spec.Extra = make(map[string]authzv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			spec.Extra[k] = authzv1.ExtraValue(v)
		}
	}
	if acc.Resource == "" {
		spec.NonResourceAttributes = &authzv1.NonResourceAttributes{Path: acc.Path, Verb: acc.Verb}
	} else {
		spec.ResourceAttributes = &authzv1.ResourceAttributes{
			Namespace: acc.Namespace, Verb: acc.Verb, Group: v1alpha1.SchemeGroupVersion.Group,
			Resource: acc.Resource, Subresource: acc.Subresource, Name: acc.Name,
		}
	}
	return &authzv1.SubjectAccessReview{Spec: spec}
}

// forbidden says what was refused, as the API server says it.
func forbidden(user string, acc gateway.Access, reason string) string {
	var msg string
	if acc.Resource == "" {
		msg = fmt.Sprintf("user %q cannot %s path %q", user, acc.Verb, acc.Path)
	} else {
		res := acc.Resource
		if acc.Subresource != "" {
			res += "/" + acc.Subresource
		}
		msg = fmt.Sprintf("user %q cannot %s resource %q in API group %q in the namespace %q", user, acc.Verb, res, v1alpha1.SchemeGroupVersion.Group, acc.Namespace)
	}
	if reason != "" {
		msg += ": " + reason
	}
	return msg
}
