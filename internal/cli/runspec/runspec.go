// Package runspec builds the Run that `stoke run` creates from its flags:
// a task (entrypoint and args) or a function (handler), its source packed
// from a local path, env, timeout, retries and labels. The Run is
// defaulted and validated here with internal/validation, so a mistake is
// reported before anything is sent.
package runspec

import (
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cli/source"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// Name prefixes the server completes with five random characters when no
// name is given.
const (
	TaskPrefix     = "task-"
	FunctionPrefix = "fn-"
)

// Options are `stoke run`'s flags.
type Options struct {
	// Name is the Run's name; empty means a generated one.
	Name      string
	Namespace string
	Runtime   string
	// Source is a local file or directory; empty means none.
	Source string
	// Entrypoint and Args make a task. With a single-file Source and no
	// Entrypoint, the file is the entrypoint and Args are its arguments.
	Entrypoint string
	Args       []string
	// Handler makes a function.
	Handler     string
	IdleTimeout time.Duration
	// Env entries are NAME=VALUE, or NAME to copy the variable from
	// LookupEnv.
	Env       []string
	LookupEnv func(string) (string, bool)
	// Labels are KEY=VALUE.
	Labels []string
	// Timeout is spec.timeout; 0 leaves it to the Runtime's default.
	Timeout time.Duration
	// Retries is how many times a failed attempt is retried:
	// retryPolicy.maxAttempts is Retries+1.
	Retries int
	// TTL, when positive, deletes the finished Run after it.
	TTL time.Duration
	// Scale, "MIN:MAX", makes a Function (with Handler) rather than a
	// function Run: a name that lasts and up to MAX replicas.
	Scale string
}

// IsFunctionObject reports whether o makes a Function (--scale).
func (o *Options) IsFunctionObject() bool { return o.Scale != "" }

// BuildFunction returns the Function o describes (--handler with --scale
// MIN:MAX), defaulted and validated. A Function needs a name (its URL is
// the name), takes the template flags of a function Run (runtime,
// source, env, labels, timeout), and refuses the flags of a single Run
// (entrypoint, args, retries, ttl, idle-timeout).
func BuildFunction(o Options) (*v1alpha1.Function, error) {
	if o.Handler == "" {
		return nil, errdefs.InvalidArgument("--scale", "makes a Function, which needs --handler")
	}
	if o.Name == "" {
		return nil, errdefs.InvalidArgument("--name", "a Function (--scale) needs a name: its invoke URL is /v1/namespaces/NS/functions/NAME/invoke")
	}
	if o.Runtime == "" {
		return nil, errdefs.InvalidArgument("--runtime", "is required (e.g. bash or python)")
	}
	for flag, set := range map[string]bool{"--entrypoint": o.Entrypoint != "", "--retries": o.Retries != 0, "--ttl": o.TTL != 0,
		"--idle-timeout": o.IdleTimeout != 0, "ARGS": len(o.Args) > 0} {
		if set {
			return nil, errdefs.InvalidArgument(flag, "does not apply to a Function (--scale): its replicas are replaced and scaled by Stoke")
		}
	}
	lo, hi, err := parseScale(o.Scale)
	if err != nil {
		return nil, err
	}
	fn := &v1alpha1.Function{}
	fn.Name, fn.Namespace = o.Name, o.Namespace
	fn.Spec.Runtime, fn.Spec.Handler = o.Runtime, o.Handler
	fn.Spec.Scale.Min, fn.Spec.Scale.Max = lo, hi
	if o.Source != "" {
		packed, err := source.Pack(o.Source)
		if err != nil {
			return nil, err
		}
		fn.Spec.Source = packed.Source
	}
	if fn.Spec.Env, err = parseEnv(o.Env, o.LookupEnv); err != nil {
		return nil, err
	}
	if fn.Labels, err = parseLabels(o.Labels); err != nil {
		return nil, err
	}
	if o.Timeout < 0 {
		return nil, errdefs.InvalidArgument("--timeout", "must not be negative")
	}
	if o.Timeout > 0 {
		fn.Spec.Timeout = &metav1.Duration{Duration: o.Timeout}
	}
	validation.SetFunctionDefaults(fn)
	if err := validation.ValidateFunction(fn); err != nil {
		return nil, err
	}
	return fn, nil
}

// parseScale reads --scale MIN:MAX.
func parseScale(s string) (lo, hi int32, err error) {
	a, b, ok := strings.Cut(s, ":")
	x, errA := strconv.ParseInt(a, 10, 32)
	y, errB := strconv.ParseInt(b, 10, 32)
	if !ok || errA != nil || errB != nil {
		return 0, 0, errdefs.InvalidArgument("--scale", "%s is not MIN:MAX (e.g. 0:8)", bounds.Quote(s))
	}
	if x < 0 || y < 1 || x > y || y > bounds.FunctionReplicas {
		return 0, 0, errdefs.InvalidArgument("--scale", "%s: want 0 ≤ MIN ≤ MAX, 1 ≤ MAX ≤ %d", bounds.Quote(s), bounds.FunctionReplicas)
	}
	return int32(x), int32(y), nil
}

// IsFunction reports whether o makes a function Run.
func (o *Options) IsFunction() bool { return o.Handler != "" }

// Build returns the Run o describes, defaulted and validated.
func Build(o Options) (*v1alpha1.Run, error) {
	run := &v1alpha1.Run{}
	run.Namespace = o.Namespace
	run.Name = o.Name
	if o.Runtime == "" {
		return nil, errdefs.InvalidArgument("--runtime", "is required (e.g. bash or python)")
	}
	run.Spec.Runtime = o.Runtime

	var packed *source.Packed
	if o.Source != "" {
		var err error
		if packed, err = source.Pack(o.Source); err != nil {
			return nil, err
		}
		run.Spec.Source = packed.Source
	}

	if o.IsFunction() {
		if o.Entrypoint != "" || len(o.Args) > 0 {
			return nil, errdefs.InvalidArgument("--handler", "a function takes no entrypoint or arguments; it is invoked with `stoke invoke`")
		}
		if o.IdleTimeout < 0 {
			return nil, errdefs.InvalidArgument("--idle-timeout", "must not be negative")
		}
		run.Spec.Mode.Function = &v1alpha1.FunctionMode{
			Handler:            o.Handler,
			IdleTimeoutSeconds: int64((o.IdleTimeout + time.Second - 1) / time.Second),
		}
		if o.Name == "" {
			run.GenerateName = FunctionPrefix
		}
	} else {
		if o.IdleTimeout != 0 {
			return nil, errdefs.InvalidArgument("--idle-timeout", "applies to functions only (with --handler)")
		}
		task := &v1alpha1.TaskMode{Entrypoint: o.Entrypoint, Args: o.Args}
		if task.Entrypoint == "" && packed != nil && packed.File != "" {
			task.Entrypoint = packed.File
		}
		if task.Entrypoint == "" && len(task.Args) == 0 {
			return nil, errdefs.InvalidArgument("task", "give a program: arguments after --, --entrypoint, or a --source file")
		}
		run.Spec.Mode.Task = task
		if o.Name == "" {
			run.GenerateName = TaskPrefix
		}
	}

	env, err := parseEnv(o.Env, o.LookupEnv)
	if err != nil {
		return nil, err
	}
	run.Spec.Env = env
	if run.Labels, err = parseLabels(o.Labels); err != nil {
		return nil, err
	}
	if o.Timeout < 0 {
		return nil, errdefs.InvalidArgument("--timeout", "must not be negative")
	}
	if o.Timeout > 0 {
		run.Spec.Timeout = &metav1.Duration{Duration: o.Timeout}
	}
	if o.Retries < 0 || o.Retries > bounds.RetryAttempts-1 {
		return nil, errdefs.InvalidArgument("--retries", "is %d, must be 0–%d", o.Retries, bounds.RetryAttempts-1)
	}
	run.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: int32(o.Retries) + 1}
	switch {
	case o.TTL < 0:
		return nil, errdefs.InvalidArgument("--ttl", "must not be negative")
	case o.TTL > 0:
		secs := int32(min((o.TTL+time.Second-1)/time.Second, 1<<31-1))
		run.Spec.TTLSecondsAfterFinished = &secs
	}

	validation.SetRunDefaults(run)
	if err := Validate(run); err != nil {
		return nil, err
	}
	return run, nil
}

// Validate checks a new Run as the server will. A Run with only
// metadata.generateName is checked with a name the server could generate.
func Validate(run *v1alpha1.Run) error {
	check := run
	if run.Name == "" && run.GenerateName != "" {
		check = run.DeepCopy()
		check.Name = run.GenerateName + "abcde"
	}
	return validation.ValidateRun(check)
}

func parseEnv(entries []string, lookup func(string) (string, bool)) ([]v1alpha1.EnvVar, error) {
	var env []v1alpha1.EnvVar
	for _, e := range entries {
		name, value, ok := strings.Cut(e, "=")
		if !ok {
			if lookup == nil {
				return nil, errdefs.InvalidArgument("--env", "%q: want NAME=VALUE", e)
			}
			if value, ok = lookup(name); !ok {
				return nil, errdefs.InvalidArgument("--env", "%q: want NAME=VALUE, or NAME of a variable set here", e)
			}
		}
		if name == "" {
			return nil, errdefs.InvalidArgument("--env", "%q: the name is empty", e)
		}
		env = append(env, v1alpha1.EnvVar{Name: name, Value: value})
	}
	return env, nil
}

func parseLabels(entries []string) (map[string]string, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	labels := make(map[string]string, len(entries))
	for _, l := range entries {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, errdefs.InvalidArgument("--label", "%q: want KEY=VALUE", l)
		}
		labels[k] = v
	}
	return labels, nil
}
