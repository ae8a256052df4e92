// Package controlplane is what standalone (`stoke up`) and Kubernetes
// (`stoke controller`) run alike: the shared Run, Runtime and Function
// informers over a store.Store, the scheduler and the stale-run reaper
// (with the TTL of finished Runs) over a podsource.Source, the Function
// controller (internal/functionset) and the autoscaler that sets its
// Functions' desired replicas (internal/autoscaler) and the workflow
// controller (internal/workflow), started and stopped as one group. Each mode brings its own store and pod source and adds its own
// components to the group (standalone: the pool supervisor, runtimed per
// pod, the lambda collector; Kubernetes: the Pod source, the Runtime
// reconciler).
package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/autoscaler"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/reaper"
	"stoke.dev/stoke/internal/scheduler"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/workflow"
)

// DefaultFinishedRunTTL is the commands' default Config.FinishedRunTTL: a
// day to look at a finished Run's status and log, after which ad-hoc Runs
// do not pile up.
const DefaultFinishedRunTTL = 24 * time.Hour

// Informers are the shared Run, Runtime, Function and WorkflowRun caches
// of one store; every component reads through them.
type Informers struct {
	Runs         *informer.Informer[*v1alpha1.Run]
	Runtimes     *informer.Informer[*v1alpha1.Runtime]
	Functions    *informer.Informer[*v1alpha1.Function]
	WorkflowRuns *informer.Informer[*v1alpha1.WorkflowRun]
}

// NewInformers returns the informers of st; Core's components run them.
func NewInformers(st store.Store, log *slog.Logger) Informers {
	return Informers{
		Runs:         informer.New(st.Runs(), informer.Options{Logger: log}),
		Runtimes:     informer.New(st.Runtimes(), informer.Options{Logger: log}),
		Functions:    informer.New(st.Functions(), informer.Options{Logger: log}),
		WorkflowRuns: informer.New(st.WorkflowRuns(), informer.Options{Logger: log}),
	}
}

// Config configures a Core.
type Config struct {
	Store     store.Store
	Informers Informers
	Pods      podsource.Source
	// PodsSynced, when set, is closed once Pods knows every live pod: the
	// scheduler and the reaper start after it, so that the reaper does not
	// take the Runs of a pod it has not heard of yet for orphans. (The
	// pool supervisor needs none: no pod outlives the process.)
	PodsSynced <-chan struct{}
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
	// SchedulerWorkers is scheduler.Config.Workers, its concurrent status
	// writes (zero: scheduler.DefaultWorkers).
	SchedulerWorkers int
	// OnScheduled observes each assignment's scheduling latency (tests).
	OnScheduled func(run *v1alpha1.Run, latency time.Duration)
	// Metrics, when set, get the scheduler's metrics (NewMetrics).
	Metrics *Metrics
	// FinishedRunTTL is how long a finished Run that sets no
	// ttlSecondsAfterFinished is kept; zero keeps it until deleted.
	FinishedRunTTL time.Duration
	// OnDeleted is called with every Run deletion the reaper observes.
	OnDeleted func(run *v1alpha1.Run)
	// FunctionDrained, when set, tells the Function controller that no
	// invocation is in flight on a draining replica
	// (functionset.Config.Drained).
	FunctionDrained func(namespace, function, runUID string) bool
	// FunctionLoad, when set, is the dispatcher's in-flight and queued
	// invocations per Function: the autoscaler's load source, and what
	// the Function controller writes to status.inFlight and
	// status.queued. Nil: the autoscaler reads them from each Function's
	// status (autoscaler.Config.Load, functionset.Config.Load).
	FunctionLoad autoscaler.LoadFunc
	// WorkflowArtifacts carries out workflow steps' upload-artifact and
	// download-artifact; nil fails them.
	WorkflowArtifacts workflow.Artifacts
	// DeleteWorkflowSteps makes the workflow controller delete the step
	// Runs of a deleted WorkflowRun (standalone; in Kubernetes the garbage
	// collector does, by owner reference).
	DeleteWorkflowSteps bool
}

// Core is the shared control plane: the informers, the scheduler, the
// reaper, the Function controller, the autoscaler and the workflow
// controller.
type Core struct {
	Informers
	Scheduler   *scheduler.Scheduler
	Reaper      *reaper.Reaper
	FunctionSet *functionset.Controller
	// Autoscaler sets the Functions' desired replicas; the dispatcher
	// calls its Poke when an invocation queues.
	Autoscaler *autoscaler.Autoscaler
	// Workflows runs the WorkflowRuns.
	Workflows *workflow.Controller

	podsSynced <-chan struct{}
	metrics    *Metrics
}

// New builds the scheduler and the reaper; Components runs them.
func New(cfg Config) (*Core, error) {
	if cfg.Store == nil || cfg.Informers.Runs == nil || cfg.Informers.Runtimes == nil || cfg.Informers.Functions == nil || cfg.Informers.WorkflowRuns == nil || cfg.Pods == nil {
		return nil, errors.New("controlplane: a store, its informers and a pod source are required")
	}
	log := logging.OrDiscard(cfg.Logger)
	st, inf := cfg.Store, cfg.Informers
	sc := scheduler.Config{Runs: st.Runs(), RunInformer: inf.Runs, Runtimes: st.Runtimes(),
		RuntimeInformer: inf.Runtimes, Pods: cfg.Pods, Logger: log, OnScheduled: cfg.OnScheduled, Workers: cfg.SchedulerWorkers}
	cfg.Metrics.hooks(&sc)
	sched, err := scheduler.New(sc)
	if err != nil {
		return nil, err
	}
	reap, err := reaper.New(reaper.Config{Runs: st.Runs(), RunInformer: inf.Runs, Pods: cfg.Pods, Logger: log,
		FinishedRunTTL: cfg.FinishedRunTTL, OnDeleted: cfg.OnDeleted})
	if err != nil {
		return nil, err
	}
	fset, err := functionset.New(functionset.Config{Functions: st.Functions(), Runs: st.Runs(), FunctionInformer: inf.Functions,
		RunInformer: inf.Runs, Drained: cfg.FunctionDrained, Load: cfg.FunctionLoad, Created: sched.Created,
		Place: sched.Place, Unplace: sched.Unplace, Logger: log})
	if err != nil {
		return nil, err
	}
	scaler, err := autoscaler.New(autoscaler.Config{Functions: st.Functions(), FunctionInformer: inf.Functions,
		Load: cfg.FunctionLoad, Expect: fset.Expect, Record: fset.Record, Logger: log})
	if err != nil {
		return nil, err
	}
	wfc, err := workflow.New(workflow.Config{WorkflowRuns: st.WorkflowRuns(), Workflows: st.Workflows(), Runs: st.Runs(),
		WorkflowRunInformer: inf.WorkflowRuns, RunInformer: inf.Runs, RuntimeInformer: inf.Runtimes,
		Artifacts: cfg.WorkflowArtifacts, DeleteRuns: cfg.DeleteWorkflowSteps, Defer: sched.Defer, Logger: log})
	if err != nil {
		return nil, err
	}
	return &Core{Informers: inf, Scheduler: sched, Reaper: reap, FunctionSet: fset, Autoscaler: scaler, Workflows: wfc,
		podsSynced: cfg.PodsSynced, metrics: cfg.Metrics}, nil
}

// Components are the informers, the scheduler, the reaper, the Function
// controller, the autoscaler and the workflow controller, for Run.
func (c *Core) Components() []Component {
	return []Component{
		{"run informer", c.Runs.Run},
		{"runtime informer", c.Runtimes.Run},
		{"function informer", c.Functions.Run},
		{"scheduler", c.afterPods(func(ctx context.Context) error {
			defer c.metrics.running(c.Scheduler)()
			return c.Scheduler.Run(ctx)
		})},
		{"reaper", c.afterPods(c.Reaper.Run)},
		{"function controller", c.FunctionSet.Run},
		{"autoscaler", c.Autoscaler.Run},
		{"workflowrun informer", c.WorkflowRuns.Run},
		{"workflow controller", c.Workflows.Run},
	}
}

// afterPods returns run, started once the pod source has synced.
func (c *Core) afterPods(run func(context.Context) error) func(context.Context) error {
	if c.podsSynced == nil {
		return run
	}
	return func(ctx context.Context) error {
		select {
		case <-c.podsSynced:
			return run(ctx)
		case <-ctx.Done():
			return nil
		}
	}
}
