package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// conditionReplicaFailure is internal/functionset's condition type.
const conditionReplicaFailure = "ReplicaFailure"

// FunctionURL is a Function's stable invoke URL from where the CLI runs:
// the standalone API's, or the gateway's on a cluster.
func FunctionURL(t client.Target, ns, name string) string {
	base := t.Server
	if t.Mode == client.Cluster && t.Gateway != "" {
		base = t.Gateway
	}
	return fmt.Sprintf("%s/v1/namespaces/%s/functions/%s/invoke", strings.TrimSuffix(base, "/"), ns, name)
}

// StartFunction creates a Function (`stoke run --scale`) and, when its
// scale.min is above 0, waits until that many replicas are Ready; then it
// prints its invoke URL to Out and, unless quiet, how to call it to Err.
// With opts.Detach it prints the name and returns at once. A Function
// whose replicas keep dying before min are Ready is an ExitFailed error
// with the last one's reason.
func StartFunction(ctx context.Context, c client.API, fn *v1alpha1.Function, opts RunOptions, s Streams) error {
	created, err := c.CreateFunction(ctx, fn)
	if ctx.Err() != nil {
		return interrupted()
	}
	if err != nil {
		return fmt.Errorf("creating the function: %w", err)
	}
	if opts.Detach {
		fmt.Fprintln(s.Out, created.Name)
		return nil
	}
	ready := created
	if want := created.Spec.Scale.Min; want > 0 {
		ready, err = waitFunction(ctx, c, created, func(f *v1alpha1.Function) bool {
			return f.Status.ReadyReplicas >= want || meta.IsStatusConditionTrue(f.Status.Conditions, conditionReplicaFailure)
		})
		if ctx.Err() != nil {
			s.note("interrupted; function/%s stays (delete it with stoke delete function %s)", created.Name, created.Name)
			return interrupted()
		}
		if err != nil {
			return fmt.Errorf("waiting for function/%s's replicas: %w", created.Name, err)
		}
		if ready.Status.ReadyReplicas < want {
			cond := meta.FindStatusCondition(ready.Status.Conditions, conditionReplicaFailure)
			return &ExitError{Code: ExitFailed, Err: fmt.Errorf("function/%s: %s", created.Name, firstLine(cond.Message))}
		}
	}
	url := FunctionURL(c.Target(), ready.Namespace, ready.Name)
	fmt.Fprintln(s.Out, url)
	if !opts.Quiet {
		s.note("function/%s has %d Ready replicas (scale %d:%d); invoke it with", ready.Name, ready.Status.ReadyReplicas, ready.Spec.Scale.Min, ready.Spec.Scale.Max)
		fmt.Fprintf(s.Err, "  stoke invoke %s%s\n", ready.Name, namespaceFlag(ready.Namespace))
		if c.Target().Mode == client.Standalone {
			fmt.Fprintf(s.Err, "  curl -H \"Authorization: Bearer $%s\" -d '{}' %s\n", client.EnvToken, url)
		}
	}
	return nil
}

// waitFunction watches a Function until done holds.
func waitFunction(ctx context.Context, c client.API, fn *v1alpha1.Function, done func(*v1alpha1.Function) bool) (*v1alpha1.Function, error) {
	cur, err := c.GetFunction(ctx, fn.Namespace, fn.Name)
	if err != nil {
		return nil, err
	}
	if done(cur) {
		return cur, nil
	}
	w, err := c.WatchFunctions(ctx, fn.Namespace, client.ListOptions{ResourceVersion: cur.ResourceVersion})
	if errors.Is(err, errdefs.ErrExpired) {
		w, err = c.WatchFunctions(ctx, fn.Namespace, client.ListOptions{})
	}
	if err != nil {
		return nil, err
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			return nil, errdefs.Errorf(errdefs.ErrUnavailable, "watching function %s/%s: the server closed the stream", fn.Namespace, fn.Name)
		}
		if err != nil {
			return nil, err
		}
		if ev.Object.Name != fn.Name || ev.Object.UID != cur.UID {
			continue
		}
		if ev.Type == client.Deleted {
			return ev.Object, errdefs.Errorf(errdefs.ErrNotFound, "function %s/%s was deleted", fn.Namespace, fn.Name)
		}
		if done(ev.Object) {
			return ev.Object, nil
		}
	}
}
