package controller

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// metricsAuth is /metrics' filter: the caller's bearer token checked with
// a TokenReview, then `get` on the request's path with a
// SubjectAccessReview, through k8s.io/apiserver's delegating authenticator
// and authorizer with controller-runtime's settings
// (filters.WithAuthenticationAndAuthorization). It differs in one answer:
// a token the TokenReview rejects with an error (a malformed or forged
// one) is 401, as the kube-apiserver answers it, where controller-runtime
// answers 500. The authenticator cannot tell that from a TokenReview that
// failed to reach the API server, so that is 401 too, logged with its
// cause; a failed SubjectAccessReview stays 500.
func metricsAuth(log *slog.Logger) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
		authn, err := authenticationv1.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, err
		}
		authz, err := authorizationv1.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, err
		}
		// The API server's webhook retry backoff (k8s.io/apiserver's
		// options.DefaultAuthWebhookRetryBackoff), as controller-runtime.
		backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
		authenticator, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
			Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
			CacheTTL:                 time.Minute,
			TokenAccessReviewClient:  authn,
			TokenAccessReviewTimeout: 10 * time.Second,
			WebhookRetryBackoff:      backoff,
		}.New()
		if err != nil {
			return nil, fmt.Errorf("metrics authenticator: %w", err)
		}
		authorize, err := authorizerfactory.DelegatingAuthorizerConfig{
			SubjectAccessReviewClient: authz,
			AllowCacheTTL:             5 * time.Minute,
			DenyCacheTTL:              30 * time.Second,
			WebhookRetryBackoff:       backoff,
		}.New()
		if err != nil {
			return nil, fmt.Errorf("metrics authorizer: %w", err)
		}
		return func(_ logr.Logger, next http.Handler) (http.Handler, error) {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				res, ok, err := authenticator.AuthenticateRequest(req)
				if err != nil {
					log.Info("metrics: authentication failed", "remote", req.RemoteAddr, "error", err)
				}
				if err != nil || !ok {
					http.Error(w, "Unauthorized", http.StatusUnauthorized)
					return
				}
				attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(req.Method), Path: req.URL.Path}
				decision, reason, err := authorize.Authorize(req.Context(), attrs)
				if err != nil {
					log.Warn("metrics: authorization failed", "user", res.User.GetName(), "error", err)
					http.Error(w, "Authorization failed", http.StatusInternalServerError)
					return
				}
				if decision != authorizer.DecisionAllow {
					log.Debug("metrics: access denied", "user", res.User.GetName(), "reason", reason)
					http.Error(w, "Forbidden", http.StatusForbidden)
					return
				}
				next.ServeHTTP(w, req)
			}), nil
		}, nil
	}
}
