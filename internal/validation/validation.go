package validation

import (
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strings"
	"unicode"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// MaxErrors is the most problems one validation error lists; further ones
// are only counted, so that a Run with thousands of bad entries still gets
// a readable answer.
const MaxErrors = 32

// maxProblem bounds one problem's message: a value it repeats is cut to
// bounds.Quoted, but a field path may hold a map key of any length.
const maxProblem = 8 * bounds.Quoted

// Lambda's own limits on what spec.lambda configures.
const (
	maxRoleARN    = 2048
	maxNamePrefix = 32
	// maxAgentListen and maxAgentURL bound spec.lambda.agentListen and
	// agentURL.
	maxAgentListen = 256
	maxAgentURL    = 2048
	maxImageURI    = 1024
	minLambdaMemMB = 128
	maxLambdaMemMB = 10240
)

// Servers are the Runtime Servers a Runtime may name.
var servers = []string{"bash", "python", "lambda"}

// ValidateRun checks a Run on creation. Call SetRunDefaults first: an empty
// namespace is an error here.
func ValidateRun(run *v1alpha1.Run) error {
	var e errorList
	if run == nil {
		e.add(field.NewPath("run"), "must not be nil")
		return e.err()
	}
	validateTypeMeta(&e, run.TypeMeta, v1alpha1.KindRun)
	validateObjectMeta(&e, &run.ObjectMeta, k8svalidation.IsDNS1123Subdomain)
	validateNoStokeFinalizers(&e, run.Finalizers)
	validateRunSpec(&e, &run.Spec, field.NewPath("spec"))
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(run, v1alpha1.Run{TypeMeta: run.TypeMeta, ObjectMeta: run.ObjectMeta, Spec: run.Spec})
}

// objectSize refuses an object whose JSON without its status — as the
// store encodes it — is over bounds.ObjectJSON: every field may be within
// its own bound while their sum, or their escaping (a '<' is six bytes of
// JSON), is not. Within it, the object is storable with any status.
func objectSize(obj metav1.Object, withoutStatus any) error {
	b, err := json.Marshal(withoutStatus)
	if err != nil {
		return errdefs.InvalidArgument("metadata.name", "%s cannot be encoded: %v", quote(obj.GetName()), err)
	}
	if len(b) > bounds.ObjectJSON {
		return errdefs.Errorf(errdefs.ErrTooLarge, "%s/%s: its JSON is %d bytes, at most %d allowed", obj.GetNamespace(), obj.GetName(), len(b), bounds.ObjectJSON)
	}
	return nil
}

// ValidateRunUpdate checks an update of old to new. The spec is immutable
// except spec.cancelRequested (false → true only) and
// spec.ttlSecondsAfterFinished; metadata name, namespace and uid are
// immutable. Labels, annotations and finalizers may change and are checked.
//
// The rest of new's spec is not re-validated: it must equal old's, which was
// validated on creation, so a Run created under older rules can still be
// cancelled.
func ValidateRunUpdate(old, new *v1alpha1.Run) error {
	var e errorList
	if old == nil || new == nil {
		e.add(field.NewPath("run"), "must not be nil")
		return e.err()
	}
	validateTypeMeta(&e, new.TypeMeta, v1alpha1.KindRun)
	validateObjectMeta(&e, &new.ObjectMeta, k8svalidation.IsDNS1123Subdomain)
	validateObjectMetaUpdate(&e, &old.ObjectMeta, &new.ObjectMeta)

	spec := field.NewPath("spec")
	o, n := &old.Spec, &new.Spec
	immutable(&e, spec.Child("runtime"), o.Runtime, n.Runtime)
	immutable(&e, spec.Child("mode"), o.Mode, n.Mode)
	immutable(&e, spec.Child("source"), o.Source, n.Source)
	immutable(&e, spec.Child("env"), o.Env, n.Env)
	immutable(&e, spec.Child("timeout"), o.Timeout, n.Timeout)
	immutable(&e, spec.Child("retryPolicy"), o.RetryPolicy, n.RetryPolicy)
	immutable(&e, spec.Child("placement"), o.Placement, n.Placement)
	if o.CancelRequested && !n.CancelRequested {
		e.add(spec.Child("cancelRequested"), "cannot be unset once true")
	}
	if n.Held && !o.Held {
		e.add(spec.Child("held"), "cannot be set once cleared: a Run is held only from its creation")
	}
	validateTTL(&e, n.TTLSecondsAfterFinished, spec.Child("ttlSecondsAfterFinished"))
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(new, v1alpha1.Run{TypeMeta: new.TypeMeta, ObjectMeta: new.ObjectMeta, Spec: new.Spec})
}

// ValidateRuntime checks a Runtime on creation or, through
// ValidateRuntimeUpdate, on update. Call SetRuntimeDefaults first.
func ValidateRuntime(rt *v1alpha1.Runtime) error {
	var e errorList
	if rt == nil {
		e.add(field.NewPath("runtime"), "must not be nil")
		return e.err()
	}
	validateRuntime(&e, rt)
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(rt, v1alpha1.Runtime{TypeMeta: rt.TypeMeta, ObjectMeta: rt.ObjectMeta, Spec: rt.Spec})
}

// ValidateRuntimeUpdate checks an update of old to new: new must be valid;
// metadata name, namespace and uid and spec.server are immutable (the pool's
// pods and the Runs on them were started for that server). Replicas, runs
// and the default timeouts may change.
func ValidateRuntimeUpdate(old, new *v1alpha1.Runtime) error {
	var e errorList
	if old == nil || new == nil {
		e.add(field.NewPath("runtime"), "must not be nil")
		return e.err()
	}
	validateRuntime(&e, new)
	validateObjectMetaUpdate(&e, &old.ObjectMeta, &new.ObjectMeta)
	immutable(&e, field.NewPath("spec", "server"), old.Spec.Server, new.Spec.Server)
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(new, v1alpha1.Runtime{TypeMeta: new.TypeMeta, ObjectMeta: new.ObjectMeta, Spec: new.Spec})
}

func validateRuntime(e *errorList, rt *v1alpha1.Runtime) {
	validateTypeMeta(e, rt.TypeMeta, v1alpha1.KindRuntime)
	// A Runtime's name is what spec.runtime of a Run refers to, so it is
	// held to the same DNS label rule.
	validateObjectMeta(e, &rt.ObjectMeta, k8svalidation.IsDNS1123Label)

	spec := field.NewPath("spec")
	s := &rt.Spec
	switch {
	case s.Server == "":
		e.add(spec.Child("server"), "must not be empty; one of %s", strings.Join(servers, ", "))
	case !contains(servers, s.Server):
		e.add(spec.Child("server"), "%s is not a known server; one of %s", quote(s.Server), strings.Join(servers, ", "))
	}
	if s.Replicas < 0 || s.Replicas > bounds.RuntimeReplicas {
		e.add(spec.Child("replicas"), "is %d, must be 0–%d", s.Replicas, bounds.RuntimeReplicas)
	}
	if s.Runs < 1 || s.Runs > bounds.RuntimeRuns {
		e.add(spec.Child("runs"), "is %d, must be 1–%d", s.Runs, bounds.RuntimeRuns)
	}
	validateDuration(e, s.DefaultTaskTimeout, spec.Child("defaultTaskTimeout"))
	validateDuration(e, s.DefaultFunctionTimeout, spec.Child("defaultFunctionTimeout"))
	validateDuration(e, s.DefaultInvokeTimeout, spec.Child("defaultInvokeTimeout"))
	validateLambda(e, s, spec.Child("lambda"))
	validateTemplate(e, s.Template, spec.Child("template"))
	if g := s.Git; g != nil && g.CredentialsSecret != "" && (len(g.CredentialsSecret) > 253 || !dnsSubdomainRE.MatchString(g.CredentialsSecret)) {
		e.add(spec.Child("git", "credentialsSecret"), "%s must be a Secret's name (a DNS-1123 subdomain)", quote(g.CredentialsSecret))
	}
}

// validateLambda checks spec.lambda: present exactly for the lambda server.
func validateLambda(e *errorList, s *v1alpha1.RuntimeSpec, p *field.Path) {
	l := s.Lambda
	switch {
	case s.Server != "lambda" && l != nil:
		e.add(p, "is only for server lambda")
		return
	case s.Server != "lambda":
		return
	case l == nil:
		e.add(p, "is required for server lambda")
		return
	}
	if l.Runtime != "bash" && l.Runtime != "python" {
		e.add(p.Child("runtime"), "%s, want bash or python", quote(l.Runtime))
	}
	if !strings.HasPrefix(l.Role, "arn:") || len(l.Role) > maxRoleARN {
		e.add(p.Child("role"), "%s is not a role ARN", quote(l.Role))
	}
	if l.Architecture != "" && l.Architecture != "x86_64" && l.Architecture != "arm64" {
		e.add(p.Child("architecture"), "%s, want x86_64 or arm64", quote(l.Architecture))
	}
	if l.MemoryMB != 0 && (l.MemoryMB < minLambdaMemMB || l.MemoryMB > maxLambdaMemMB) {
		e.add(p.Child("memoryMB"), "is %d, must be %d–%d", l.MemoryMB, minLambdaMemMB, maxLambdaMemMB)
	}
	if len(l.NamePrefix) > maxNamePrefix || strings.ContainsFunc(l.NamePrefix, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) {
		e.add(p.Child("namePrefix"), "%s: at most %d letters, digits, - and _", quote(l.NamePrefix), maxNamePrefix)
	}
	if l.Bootstrap != "" && (!strings.HasPrefix(l.Bootstrap, "/") || len(l.Bootstrap) > bounds.Path) {
		e.add(p.Child("bootstrap"), "%s is not an absolute path", quote(l.Bootstrap))
	}
	switch {
	case len(l.Image) > maxImageURI || strings.ContainsFunc(l.Image, unicode.IsSpace):
		e.add(p.Child("image"), "%s is not an image URI (at most %d characters, no spaces)", quote(l.Image), maxImageURI)
	case l.Image != "" && l.Bootstrap != "":
		e.add(p.Child("image"), "and bootstrap exclude each other: an image function's bootstrap is the image's /opt/stoke/bootstrap")
	}
	for name, v := range map[string]string{"agentCert": l.AgentCert, "agentKey": l.AgentKey} {
		if v != "" && (!strings.HasPrefix(v, "/") || len(v) > bounds.Path) {
			e.add(p.Child(name), "%s is not an absolute path", quote(v))
		}
	}
	if (l.AgentCert == "") != (l.AgentKey == "") {
		e.add(p.Child("agentKey"), "agentCert and agentKey go together")
	}
	if l.AgentListen != "" {
		host, _, err := net.SplitHostPort(l.AgentListen)
		switch {
		case err != nil || len(l.AgentListen) > maxAgentListen:
			e.add(p.Child("agentListen"), "%s is not host:port", quote(l.AgentListen))
		case l.AgentCert == "" && !IsLoopback(host):
			e.add(p.Child("agentListen"), "%s is not a loopback address: it needs agentCert and agentKey (TLS)", quote(l.AgentListen))
		}
	}
	if l.AgentURL != "" {
		u, err := url.Parse(l.AgentURL)
		switch {
		case err != nil || len(l.AgentURL) > maxAgentURL || u.Host == "" || (u.Scheme != "ws" && u.Scheme != "wss"):
			e.add(p.Child("agentURL"), "%s is not a ws:// or wss:// URL", quote(l.AgentURL))
		case u.Scheme == "ws" && !IsLoopback(u.Hostname()):
			e.add(p.Child("agentURL"), "%s: plaintext (ws://) to a loopback address only; use wss://", quote(l.AgentURL))
		}
	}
}

// IsLoopback reports whether host (a name or an address, without port)
// is this machine's loopback: the one place plaintext is allowed.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func validateTypeMeta(e *errorList, tm metav1.TypeMeta, kind string) {
	// Go clients may leave TypeMeta empty; what is set must be ours.
	if tm.APIVersion != "" && tm.APIVersion != v1alpha1.GroupVersion.String() {
		e.add(field.NewPath("apiVersion"), "%s, want %s", quote(tm.APIVersion), v1alpha1.GroupVersion.String())
	}
	if tm.Kind != "" && tm.Kind != kind {
		e.add(field.NewPath("kind"), "%s, want %s", quote(tm.Kind), kind)
	}
}

func validateObjectMeta(e *errorList, m *metav1.ObjectMeta, nameRule func(string) []string) {
	meta := field.NewPath("metadata")
	if m.Name == "" {
		e.add(meta.Child("name"), "must not be empty")
	} else {
		for _, msg := range nameRule(m.Name) {
			e.add(meta.Child("name"), "%s: %s", quote(m.Name), msg)
		}
	}
	if m.Namespace == "" {
		e.add(meta.Child("namespace"), "must not be empty")
	} else {
		for _, msg := range k8svalidation.IsDNS1123Label(m.Namespace) {
			e.add(meta.Child("namespace"), "%s: %s", quote(m.Namespace), msg)
		}
	}
	e.addList(metav1validation.ValidateLabels(m.Labels, meta.Child("labels")))
	e.addList(apivalidation.ValidateAnnotations(m.Annotations, meta.Child("annotations")))
	e.addList(apivalidation.ValidateFinalizers(m.Finalizers, meta.Child("finalizers")))
}

// IsStokeFinalizer reports whether a finalizer is one of Stoke's own
// (stoke.dev/…), which only Stoke sets and removes: a client's could keep
// a Run from ever going away.
func IsStokeFinalizer(f string) bool {
	return strings.HasPrefix(f, v1alpha1.Group+"/")
}

func validateNoStokeFinalizers(e *errorList, finalizers []string) {
	for i, f := range finalizers {
		if IsStokeFinalizer(f) {
			e.add(field.NewPath("metadata", "finalizers").Index(i), "%s is Stoke's own; only Stoke sets and removes it", quote(f))
		}
	}
}

func validateObjectMetaUpdate(e *errorList, old, new *metav1.ObjectMeta) {
	meta := field.NewPath("metadata")
	immutable(e, meta.Child("name"), old.Name, new.Name)
	immutable(e, meta.Child("namespace"), old.Namespace, new.Namespace)
	immutable(e, meta.Child("uid"), old.UID, new.UID)
}

func validateRunSpec(e *errorList, s *v1alpha1.RunSpec, spec *field.Path) {
	if s.Runtime == "" {
		e.add(spec.Child("runtime"), "must not be empty")
	} else {
		for _, msg := range k8svalidation.IsDNS1123Label(s.Runtime) {
			e.add(spec.Child("runtime"), "%s: %s", quote(s.Runtime), msg)
		}
	}
	validateMode(e, &s.Mode, spec.Child("mode"))
	validateSource(e, s.Source, spec.Child("source"))
	validateEnv(e, s.Env, spec.Child("env"))
	validateDuration(e, s.Timeout, spec.Child("timeout"))
	validateRetryPolicy(e, s.RetryPolicy, spec.Child("retryPolicy"))
	validateTTL(e, s.TTLSecondsAfterFinished, spec.Child("ttlSecondsAfterFinished"))
	validatePlacement(e, s.Placement, spec.Child("placement"))
}

func validateMode(e *errorList, m *v1alpha1.RunMode, mode *field.Path) {
	switch {
	case m.Task == nil && m.Function == nil:
		e.add(mode, "exactly one of task or function must be set, got neither")
		return
	case m.Task != nil && m.Function != nil:
		e.add(mode, "exactly one of task or function must be set, got both")
		return
	}
	if t := m.Task; t != nil {
		task := mode.Child("task")
		if t.Entrypoint == "" && len(t.Args) == 0 {
			e.add(task, "entrypoint or args must be set")
		}
		if t.Entrypoint != "" {
			e.addErr(RelativePath(task.Child("entrypoint").String(), t.Entrypoint))
		}
		args := task.Child("args")
		if len(t.Args) > bounds.Args {
			e.add(args, "has %d entries, at most %d allowed", len(t.Args), bounds.Args)
		} else {
			for i, a := range t.Args {
				switch {
				case len(a) > bounds.Arg:
					e.add(args.Index(i), "is %d bytes, at most %d allowed", len(a), bounds.Arg)
				case strings.IndexByte(a, 0) >= 0:
					e.add(args.Index(i), "contains a NUL byte")
				}
			}
		}
		if sz := t.TTYSize; sz != nil {
			p := task.Child("ttySize")
			if !t.TTY {
				e.add(p, "needs tty")
			}
			if sz.Width < 1 || sz.Width > maxTerminalSide {
				e.add(p.Child("width"), "is %d, must be 1 to %d", sz.Width, maxTerminalSide)
			}
			if sz.Height < 1 || sz.Height > maxTerminalSide {
				e.add(p.Child("height"), "is %d, must be 1 to %d", sz.Height, maxTerminalSide)
			}
		}
	}
	if f := m.Function; f != nil {
		fn := mode.Child("function")
		validateHandler(e, f.Handler, fn.Child("handler"))
		if f.IdleTimeoutSeconds < 0 {
			e.add(fn.Child("idleTimeoutSeconds"), "is %d, must not be negative", f.IdleTimeoutSeconds)
		}
	}
}

// validateHandler checks the syntax both built-in servers share: Bash's
// "path/file.function" and Python's "pkg.module.function" both have at least
// one '.', a non-empty part before the last '.', and an identifier after it,
// and both name something inside the working directory. Whether the file or
// module exists, and the server's exact syntax, is the Runtime Server's
// check at registration.
func validateHandler(e *errorList, h string, p *field.Path) {
	switch {
	case h == "":
		e.add(p, "must not be empty")
		return
	case len(h) > bounds.Handler:
		e.add(p, "is %d bytes, at most %d allowed", len(h), bounds.Handler)
		return
	}
	if err := RelativePath(p.String(), h); err != nil {
		e.addErr(err)
		return
	}
	dot := strings.LastIndexByte(h, '.')
	if dot < 0 {
		e.add(p, "%s must be file.function or module.function", quote(h))
		return
	}
	if prefix := h[:dot]; prefix == "" || strings.HasSuffix(prefix, "/") {
		e.add(p, "%s names no file or module before the function", quote(h))
	}
	if !isIdentifier(h[dot+1:]) {
		e.add(p, "%s: function name %s must match [A-Za-z_][A-Za-z0-9_]*", quote(h), quote(h[dot+1:]))
	}
}

func validateSource(e *errorList, s *v1alpha1.Source, src *field.Path) {
	if s == nil {
		return
	}
	if s.Inline != nil && s.Archive != nil {
		e.add(src, "at most one of inline or archive may be set")
	}
	if in := s.Inline; in != nil {
		inline := src.Child("inline")
		e.addErr(RelativePath(inline.Child("path").String(), in.Path))
		if len(in.Text) > bounds.Source {
			e.add(inline.Child("text"), "is %d bytes, at most %d allowed", len(in.Text), bounds.Source)
		}
	}
	if g := s.Git; g != nil {
		validateGitSource(e, g, src.Child("git"))
	}
	if ar := s.Archive; ar != nil {
		tgz := src.Child("archive", "tarGz")
		switch {
		case len(ar.TarGz) == 0:
			e.add(tgz, "must not be empty")
		case len(ar.TarGz) > bounds.Source:
			e.add(tgz, "is %d bytes, at most %d allowed", len(ar.TarGz), bounds.Source)
		case len(ar.TarGz) < 2 || ar.TarGz[0] != 0x1f || ar.TarGz[1] != 0x8b:
			e.add(tgz, "is not gzip data")
		}
	}
}

func validateEnv(e *errorList, env []v1alpha1.EnvVar, p *field.Path) {
	if len(env) > bounds.EnvEntries {
		e.add(p, "has %d entries, at most %d allowed", len(env), bounds.EnvEntries)
		return
	}
	seen := make(map[string]int, len(env))
	for i, v := range env {
		entry := p.Index(i)
		if v.Name == "" {
			e.add(entry.Child("name"), "must not be empty")
			continue
		}
		// The Runtime Server's own rule for env keys and values.
		e.addErr(Env(entry.String(), map[string]string{v.Name: v.Value}))
		if j, dup := seen[v.Name]; dup {
			e.add(entry.Child("name"), "%s duplicates %s", quote(v.Name), p.Index(j))
		} else {
			seen[v.Name] = i
		}
	}
}

func validateRetryPolicy(e *errorList, rp *v1alpha1.RetryPolicy, p *field.Path) {
	if rp == nil {
		return
	}
	// 0 means the default (1).
	if rp.MaxAttempts < 0 || rp.MaxAttempts > bounds.RetryAttempts {
		e.add(p.Child("maxAttempts"), "is %d, must be 1–%d (0 means 1)", rp.MaxAttempts, bounds.RetryAttempts)
	}
	validateDuration(e, rp.Backoff, p.Child("backoff"))
	reasons := p.Child("retryableReasons")
	for i, r := range rp.RetryableReasons {
		// A reason ends up in status.reason and in conditions, so it follows
		// the Kubernetes condition-reason syntax.
		switch {
		case r == "":
			e.add(reasons.Index(i), "must not be empty")
		case len(r) > maxConditionReason:
			e.add(reasons.Index(i), "is %d bytes, at most %d allowed", len(r), maxConditionReason)
		default:
			for _, msg := range metav1validation.IsValidConditionReason(r) {
				e.add(reasons.Index(i), "%s: %s", quote(r), msg)
			}
		}
	}
}

// maxConditionReason is metav1.Condition's limit on reason.
const maxConditionReason = 1024

// maxTerminalSide bounds a terminal's width and height, as a pty's
// winsize holds them (16 bits each).
const maxTerminalSide = 1<<16 - 1

func validateTTL(e *errorList, ttl *int32, p *field.Path) {
	if ttl != nil && *ttl < 0 {
		e.add(p, "is %d, must not be negative", *ttl)
	}
}

func validateDuration(e *errorList, d *metav1.Duration, p *field.Path) {
	if d != nil && d.Duration < 0 {
		e.add(p, "is %s, must not be negative", d.Duration)
	}
}

func immutable(e *errorList, p *field.Path, old, new any) {
	if !apiequality.Semantic.DeepEqual(old, new) {
		e.add(p, "is immutable")
	}
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// quote repeats at most bounds.Quoted bytes of a user's value in a
// message.
func quote(s string) string { return bounds.Quote(s) }

// errorList collects the problems of one object.
type errorList struct {
	errs    []error
	dropped int
}

func (e *errorList) add(p *field.Path, format string, args ...any) {
	e.addErr(errdefs.InvalidArgument(p.String(), format, args...))
}

func (e *errorList) addErr(err error) {
	if err == nil {
		return
	}
	if len(e.errs) >= MaxErrors {
		e.dropped++
		return
	}
	if msg := err.Error(); len(msg) > maxProblem {
		// Every problem here is an invalid argument.
		err = errdefs.Errorf(errdefs.ErrInvalidArgument, "%s", bounds.Truncate(msg, maxProblem))
	}
	e.errs = append(e.errs, err)
}

// addList takes apimachinery's field errors, keeping their field paths.
// apimachinery repeats an invalid value whole (a label value of megabytes):
// it is cut as quote cuts one.
func (e *errorList) addList(list field.ErrorList) {
	for _, fe := range list {
		fe := *fe
		if s, ok := fe.BadValue.(string); ok {
			fe.BadValue = bounds.Truncate(s, bounds.Quoted)
		}
		e.addErr(errdefs.InvalidArgument(fe.Field, "%s", fe.ErrorBody()))
	}
}

func (e *errorList) err() error {
	errs := e.errs
	if e.dropped > 0 {
		errs = append(errs, errdefs.Errorf(errdefs.ErrInvalidArgument, "and %d more problems", e.dropped))
	}
	return errors.Join(errs...)
}
