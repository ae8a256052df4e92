// Package runtimeset makes each Runtime a set of runtime Pods in
// Kubernetes mode: a Deployment of spec.replicas Pods, each running
// `stoke runtime-server` and `stoke runtimed` side by side (see
// Deployment), owned by the Runtime so that the garbage collector removes
// the Deployment and its Pods with it; in the Runtime's namespace the
// ServiceAccount stoke-runtimed with its least-privilege Role and
// RoleBinding, and runtimed's TLS Secret from internal/pki; and the
// Runtime's status: its ready Pods and free Run slots.
//
// Two controllers of one controller-runtime manager do this: "runtime"
// writes the objects (reading the API directly for those it does not
// watch, so that the controller needs no cluster-wide watch of Secrets or
// RBAC), "runtime-status" computes the status from the manager's cache of
// Pods and the leader's informer of Runs (RunFeed) and writes it at most once per Options.StatusInterval per
// Runtime, so that a busy Runtime's status costs a bounded number of API
// writes, not one per Run.
package runtimeset

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/pki"
)

// Options configure the reconcilers.
type Options struct {
	// Image is the runtime Pods' image (default "stoke"); its PATH has
	// stoke, bash and python3.
	Image string
	// GatewayURL is the gateway Service's base URL, under which a Ready
	// function's status.endpoint is its invoke URL (runtimed's
	// --endpoint-base); empty gives the path alone.
	GatewayURL string
	// ImagePullPolicy defaults to IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// Namespace is the controller's namespace: home of the CA and the
	// gateway's TLS Secret. Required.
	Namespace string
	// RunAsUser is the runtime Pods' user and group (default 65532).
	RunAsUser int64
	// TerminationGracePeriod is the runtime Pods' (default 30 s).
	TerminationGracePeriod time.Duration
	// Runs are the Runs the "runtime-status" controller counts slots
	// from: the leader's informer of Runs (RunFeed). Required.
	Runs *RunFeed
	// StatusInterval is the least time between two status writes of one
	// Runtime (default 1 s).
	StatusInterval time.Duration
	// Resync is how often the objects of a Runtime's namespace that the
	// controller does not watch (ServiceAccount, Role, RoleBinding, TLS
	// Secret) are checked again (default 10 min).
	Resync time.Duration
	Logger *slog.Logger
	Clock  clock.Clock
}

func (o Options) withDefaults() Options {
	o.Image = cmp.Or(o.Image, defaultImage)
	o.ImagePullPolicy = cmp.Or(o.ImagePullPolicy, corev1.PullIfNotPresent)
	o.RunAsUser = cmp.Or(o.RunAsUser, 65532)
	o.TerminationGracePeriod = cmp.Or(o.TerminationGracePeriod, 30*time.Second)
	o.StatusInterval = cmp.Or(o.StatusInterval, time.Second)
	o.Resync = cmp.Or(o.Resync, 10*time.Minute)
	o.Logger = logging.OrDiscard(o.Logger)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// Setup adds the reconcilers and the CA keeper to mgr. They run on the
// elected leader only (controller-runtime's default). mgr's scheme must
// hold core/v1, apps/v1, rbac/v1 and stoke.dev/v1alpha1.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.Namespace == "" {
		return errors.New("runtimeset: the controller's namespace is required")
	}
	if opts.Runs == nil {
		return errors.New("runtimeset: the Run feed is required")
	}
	opts = opts.withDefaults()
	issuer := &pki.Issuer{
		Client:    mgr.GetClient(),
		Reader:    mgr.GetAPIReader(),
		Namespace: opts.Namespace,
		Now:       opts.Clock.Now,
		Logger:    opts.Logger,
	}
	if err := mgr.Add(&caKeeper{issuer: issuer, clock: opts.Clock, log: opts.Logger}); err != nil {
		return err
	}
	if err := setupObjects(mgr, opts, issuer); err != nil {
		return err
	}
	return setupStatus(mgr, opts)
}
