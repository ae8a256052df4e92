package docker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// Annotations a container's Run carries: its Docker ID and what `docker
// inspect` shows of its creation.
const (
	AnnotationID     = "docker.stoke.dev/id"
	AnnotationConfig = "docker.stoke.dev/config"
)

// autoRemoveBackstop is the ttlSecondsAfterFinished of an AutoRemove Run:
// the Docker API deletes it as soon as it ended and no attach reads it;
// the TTL deletes it if stoke up stopped in between.
const autoRemoveBackstop = 60

// meta is what a container's Run keeps of its Docker creation.
type meta struct {
	Image       string            `json:"image"`
	Cmd         []string          `json:"cmd,omitempty"`
	Entrypoint  []string          `json:"entrypoint,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	StopSignal  string            `json:"stopSignal,omitempty"`
	StopTimeout *int              `json:"stopTimeout,omitempty"`
	AutoRemove  bool              `json:"autoRemove,omitempty"`
	// Tty, OpenStdin and StdinOnce are the main process's (attach.go).
	Tty       bool `json:"tty,omitempty"`
	OpenStdin bool `json:"openStdin,omitempty"`
	StdinOnce bool `json:"stdinOnce,omitempty"`
	// ConsoleSize is create's [height, width] of the terminal (Tty), the
	// task's spec.mode.task.ttySize; nil: 80×24.
	ConsoleSize []uint    `json:"consoleSize,omitempty"`
	Created     time.Time `json:"created"`
}

// ctr is one container: a task Run, held (spec.held) while the container
// is created and not started.
type ctr struct {
	id, name string
	meta     meta
	env      []string
	runtime  string
	// run is the Run once started; nil while created.
	run *v1alpha1.Run
	// held is the Run while created: held, not ended (a held Run that was
	// cancelled is an exited container).
	held *v1alpha1.Run
}

func (c *ctr) running() bool { return c.run != nil && !c.run.Status.Phase.Terminal() }

func (c *ctr) argv() []string { return append(slices.Clone(c.meta.Entrypoint), c.meta.Cmd...) }

// state is Docker's status word of the container.
func (c *ctr) state() container.ContainerState {
	switch {
	case c.run == nil:
		return container.StateCreated
	case c.run.Status.Phase.Terminal():
		return container.StateExited
	}
	return container.StateRunning
}

// exitCode is the Run's exit status; a Run that ended without one (it never
// started, or was killed before) reports what Docker would: 137 when
// cancelled, 125 when it could not start, 124 on its timeout.
func (c *ctr) exitCode() int {
	if c.run == nil {
		return 0
	}
	st := c.run.Status
	if st.ExitCode != nil && *st.ExitCode >= 0 {
		return int(*st.ExitCode)
	}
	switch st.Phase {
	case v1alpha1.PhaseCancelled:
		return 137
	case v1alpha1.PhaseTimeout:
		return 124
	case v1alpha1.PhaseFailed:
		return 125
	}
	return 0
}

// containerID is a Run's Docker ID: the one it was created with, or, for
// a Run made with stoke, from its UID.
func containerID(run *v1alpha1.Run) string {
	if id := run.Annotations[AnnotationID]; id != "" {
		return id
	}
	sum := sha256.Sum256([]byte(run.UID))
	return hex.EncodeToString(sum[:])
}

// fromRun is the container view of a task Run.
func (s *Server) fromRun(run *v1alpha1.Run) *ctr {
	c := &ctr{id: containerID(run), name: run.Name, run: run, runtime: run.Spec.Runtime}
	if run.Spec.Held && !run.Status.Phase.Terminal() {
		c.run, c.held = nil, run
	}
	if raw := run.Annotations[AnnotationConfig]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &c.meta)
	} else {
		c.meta = meta{Image: "stoke/" + run.Spec.Runtime, Labels: run.Labels, Created: run.CreationTimestamp.UTC()}
		if t := run.Spec.Mode.Task; t != nil {
			c.meta.Cmd, c.meta.Tty, c.meta.OpenStdin = t.Args, t.TTY, t.Stdin
			if sz := t.TTYSize; sz != nil {
				c.meta.ConsoleSize = []uint{uint(sz.Height), uint(sz.Width)}
			}
			if t.Entrypoint != "" {
				c.meta.Entrypoint = []string{t.Entrypoint}
			}
		}
	}
	for _, e := range run.Spec.Env {
		c.env = append(c.env, e.Name+"="+e.Value)
	}
	return c
}

// containers are the namespace's task Runs, newest first; without all,
// only the running ones.
func (s *Server) containers(all bool) []*ctr {
	var out []*ctr
	for _, run := range s.cfg.Backend.CachedRuns(s.cfg.Namespace) {
		if run.Spec.Mode.Task == nil {
			continue
		}
		c := s.fromRun(run)
		if all || c.running() {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].meta.Created.After(out[j].meta.Created) })
	return out
}

// lookup finds a container by ID, name or unique ID prefix, as Docker does.
func (s *Server) lookup(ref string) (*ctr, error) {
	name := strings.TrimPrefix(ref, "/")
	if name == "" {
		return nil, noSuchContainer(ref)
	}
	if run, ok := s.cfg.Backend.CachedRun(s.cfg.Namespace, name); ok && run.Spec.Mode.Task != nil {
		return s.fromRun(run), nil
	}
	var found *ctr
	for _, c := range s.containers(true) {
		if c.id == name {
			return c, nil
		}
		if strings.HasPrefix(c.id, name) {
			if found != nil {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "multiple IDs found with provided prefix: %s", bounds.Truncate(name, bounds.Quoted))
			}
			found = c
		}
	}
	if found == nil {
		return s.lookupStored(name, ref)
	}
	return found, nil
}

// lookupStored finds, by its full ID, a container another server created
// a moment ago and this one does not hold in memory yet (the Kubernetes
// gateway's replicas): a client that created it there may start, inspect
// or remove it here at once. One read of the store, for full IDs only,
// and only of the Runs not yet scheduled (a created container's).
func (s *Server) lookupStored(name, ref string) (*ctr, error) {
	if len(name) != 64 || strings.Trim(name, "0123456789abcdef") != "" {
		return nil, noSuchContainer(ref)
	}
	ctx, cancel := context.WithTimeout(s.serverCtx(), storedLookupBound)
	defer cancel()
	runs, _, err := s.cfg.Backend.ListRuns(ctx, store.ListOptions{Namespace: s.cfg.Namespace, Phases: []v1alpha1.Phase{"", v1alpha1.PhasePending}})
	if err != nil {
		s.log.Warn("docker: reading the store for a container not in memory", "container", name[:12], "error", err)
		return nil, noSuchContainer(ref)
	}
	for _, run := range runs {
		if run.Spec.Mode.Task != nil && run.Annotations[AnnotationID] == name {
			return s.fromRun(run), nil
		}
	}
	return nil, noSuchContainer(ref)
}

// storedLookupBound bounds lookupStored's read of the store.
const storedLookupBound = 10 * time.Second

// readJSON decodes a bounded JSON body; an empty body leaves v as it is.
func readJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, bounds.DockerRequest+1))
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "reading the body: %v", err)
	}
	if len(body) > bounds.DockerRequest {
		return errdefs.Errorf(errdefs.ErrTooLarge, "the request body is over %d bytes", bounds.DockerRequest)
	}
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON: %s", bounds.Truncate(err.Error(), bounds.Quoted*4))
	}
	return nil
}

func newID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) containerCreate(w http.ResponseWriter, r *http.Request) {
	var req container.CreateRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Config == nil {
		writeError(w, errdefs.InvalidArgument("Config", "is required"))
		return
	}
	cfg, host := req.Config, req.HostConfig
	if host == nil {
		host = &container.HostConfig{}
	}
	if err := unsupported(cfg, host); err != nil {
		writeError(w, err)
		return
	}
	rule, ref, err := s.resolve(cfg.Image)
	if err != nil {
		writeError(w, err)
		return
	}
	id := newID()
	name := strings.TrimPrefix(r.URL.Query().Get("name"), "/")
	if name == "" {
		name = "docker-" + id[:12]
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 || len(name) > 63 {
		writeError(w, errdefs.InvalidArgument("name", "%s: a container's name is its Run's, lower-case letters, digits, '-' and '.', at most 63 characters", bounds.Truncate(name, bounds.Quoted)))
		return
	}
	c := &ctr{id: id, name: name, runtime: rule.Runtime, env: cfg.Env, meta: meta{Image: ref, Cmd: cfg.Cmd, Entrypoint: cfg.Entrypoint,
		Labels: cfg.Labels, StopSignal: cfg.StopSignal, StopTimeout: cfg.StopTimeout, AutoRemove: host.AutoRemove, Created: time.Now().UTC(),
		Tty: cfg.Tty, OpenStdin: cfg.OpenStdin, StdinOnce: cfg.StdinOnce}}
	if rows, cols := host.ConsoleSize[0], host.ConsoleSize[1]; cfg.Tty && rows > 0 && cols > 0 {
		if rows > math.MaxUint16 || cols > math.MaxUint16 {
			writeError(w, errdefs.InvalidArgument("HostConfig.ConsoleSize", "is %d×%d, at most %d each", rows, cols, math.MaxUint16))
			return
		}
		c.meta.ConsoleSize = []uint{rows, cols}
	}
	if (c.meta.Tty || c.meta.OpenStdin) && s.onLambda(c) {
		writeError(w, notOnLambda(c, "give its task a terminal or stdin (-t, -i): run it detached and use `docker exec -it` into it"))
		return
	}
	if len(c.meta.Cmd) == 0 && len(c.meta.Entrypoint) == 0 {
		c.meta.Cmd = rule.Cmd
	}
	if len(c.argv()) == 0 {
		writeError(w, errdefs.InvalidArgument("Cmd", "no command specified"))
		return
	}
	run, err := s.toRun(c)
	if err != nil {
		writeError(w, err)
		return
	}
	if n := s.heldCount(); n >= bounds.DockerCreated {
		writeError(w, errdefs.Errorf(errdefs.ErrResourceExhausted, "%d containers are created and not started in namespace %s, the most it keeps; start or remove one", n, s.cfg.Namespace))
		return
	}
	// A created container is its Run, held until `docker start`: every
	// server on the same Runs (a restarted stoke up, the gateway's other
	// replicas) finds it.
	run.Spec.Held = true
	if _, err := s.cfg.Backend.CreateRun(r.Context(), run); err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			other := "a Run"
			if cur, lerr := s.lookup(name); lerr == nil {
				other = "container " + strconv.Quote(cur.id)
			}
			err = errdefs.Errorf(errdefs.ErrAlreadyExists, "Conflict. The container name %q is already in use by %s. You have to remove (or rename) that container to be able to reuse that name.", "/"+name, other)
		}
		writeError(w, err)
		return
	}
	s.cfg.Images.remember(ref)
	s.event(c, events.ActionCreate, nil)
	writeJSON(w, http.StatusCreated, container.CreateResponse{ID: id, Warnings: []string{}})
}

// unsupported refuses what a task Run cannot do, naming the field.
func unsupported(cfg *container.Config, host *container.HostConfig) error {
	switch {
	case cfg.WorkingDir != "":
		return errdefs.InvalidArgument("WorkingDir", "a container runs in its Run's own working directory on Stoke; -w is not supported")
	case cfg.User != "":
		return errdefs.InvalidArgument("User", "a container runs as the Runtime's user on Stoke; --user is not supported")
	case len(host.Binds) > 0 || len(host.Mounts) > 0:
		return errdefs.InvalidArgument("HostConfig.Binds", "volumes and mounts are not supported on Stoke: copy files in with `docker cp`")
	case host.Privileged:
		return errdefs.InvalidArgument("HostConfig.Privileged", "privileged containers are not supported on Stoke")
	}
	return nil
}

// heldCount is how many containers of the namespace are created and not
// started, as the Runs in memory say.
func (s *Server) heldCount() int {
	n := 0
	for _, run := range s.cfg.Backend.CachedRuns(s.cfg.Namespace) {
		if run.Spec.Held && !run.Status.Phase.Terminal() {
			n++
		}
	}
	return n
}

// toRun is the task Run that runs a created container.
func (s *Server) toRun(c *ctr) (*v1alpha1.Run, error) {
	namespace := s.cfg.Namespace
	raw, err := json.Marshal(c.meta)
	if err != nil {
		return nil, err
	}
	rule, _, err := s.resolve(c.meta.Image)
	if err != nil {
		return nil, err
	}
	args, err := rule.taskArgs(c.argv())
	if err != nil {
		return nil, err
	}
	run := &v1alpha1.Run{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: namespace, Annotations: map[string]string{AnnotationID: c.id, AnnotationConfig: string(raw)}},
		Spec:       v1alpha1.RunSpec{Runtime: c.runtime, Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args, Stdin: c.meta.OpenStdin, TTY: c.meta.Tty}}},
	}
	if cs := c.meta.ConsoleSize; len(cs) == 2 && c.meta.Tty {
		run.Spec.Mode.Task.TTYSize = &v1alpha1.TerminalSize{Height: int32(min(cs[0], math.MaxUint16)), Width: int32(min(cs[1], math.MaxUint16))}
	}
	// Labels that are Kubernetes labels select the Run too (stoke get -l);
	// all of them are in the config annotation.
	for k, v := range c.meta.Labels {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			if run.Labels == nil {
				run.Labels = map[string]string{}
			}
			run.Labels[k] = v
		}
	}
	for _, kv := range c.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue // a name alone: the client had no value for it
		}
		run.Spec.Env = slices.DeleteFunc(run.Spec.Env, func(e v1alpha1.EnvVar) bool { return e.Name == k })
		run.Spec.Env = append(run.Spec.Env, v1alpha1.EnvVar{Name: k, Value: v})
	}
	if c.meta.AutoRemove {
		ttl := int32(autoRemoveBackstop)
		run.Spec.TTLSecondsAfterFinished = &ttl
	}
	if len(raw) > bounds.DockerRequest {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "the container's configuration is over %d bytes", bounds.DockerRequest)
	}
	return run, nil
}

func (s *Server) containerStart(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if c.run != nil {
		if c.running() {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		writeError(w, errdefs.Errorf(errdefs.ErrNotRunning, "container %s has exited: a task Run runs once on Stoke; create another container", c.id[:12]))
		return
	}
	run, err := s.start(r, c)
	if err != nil {
		writeError(w, err)
		return
	}
	// As Docker's: the answer comes once the process runs (or ended), so
	// that an exec right after it finds it.
	if err := s.awaitStarted(r.Context(), run); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// awaitStarted waits until the Runs in memory show run Running or ended,
// so that what the client asks next of this server finds it so (exec,
// wait, logs). A Run deleted meanwhile ends the wait.
func (s *Server) awaitStarted(ctx context.Context, run *v1alpha1.Run) error {
	tick := time.NewTicker(waitRecheck)
	defer tick.Stop()
	for {
		ch := s.changes()
		if cur, ok := s.cfg.Backend.CachedRun(run.Namespace, run.Name); ok {
			if cur.UID != run.UID {
				return nil // removed, and the name taken again
			}
			if p := cur.Status.Phase; !cur.Spec.Held && (p == v1alpha1.PhaseRunning || p.Terminal()) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-tick.C:
			// No event for a deletion the Runs in memory have not seen.
			if got, err := s.cfg.Backend.GetRun(ctx, run.Namespace, run.Name); errors.Is(err, errdefs.ErrNotFound) || (err == nil && got.UID != run.UID) {
				return nil
			}
		}
	}
}

// start releases a created container's held Run (one write), or, for a
// restart (held nil), creates its Run anew.
func (s *Server) start(r *http.Request, c *ctr) (*v1alpha1.Run, error) {
	if c.meta.AutoRemove {
		// This server deletes it once it ended (Config.Replicated).
		s.mu.Lock()
		s.started[c.id] = struct{}{}
		s.mu.Unlock()
	}
	var run *v1alpha1.Run
	var err error
	if c.held != nil {
		run, err = s.cfg.Backend.ReleaseRun(r.Context(), c.held.Namespace, c.held.Name)
		if err == nil && run.UID != c.held.UID {
			err = noSuchContainer(c.id)
		}
	} else if run, err = s.toRun(c); err == nil {
		run, err = s.cfg.Backend.CreateRun(r.Context(), run)
	}
	if err != nil {
		s.mu.Lock()
		delete(s.started, c.id)
		s.mu.Unlock()
		return nil, fmt.Errorf("starting container %s: %w", c.id[:12], err)
	}
	s.wake()
	s.log.Info("docker: container started", "container", c.id[:12], "run", run.Namespace+"/"+run.Name, "run_uid", run.UID)
	return run, nil
}

func (s *Server) containerInspect(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.inspect(c))
}

func (s *Server) inspect(c *ctr) container.InspectResponse {
	st := &container.State{Status: c.state(), Running: c.running(), ExitCode: c.exitCode(),
		StartedAt: "0001-01-01T00:00:00Z", FinishedAt: "0001-01-01T00:00:00Z"}
	if c.run != nil {
		if t := c.run.Status.StartTime; t != nil {
			st.StartedAt = t.UTC().Format(time.RFC3339Nano)
		} else {
			st.StartedAt = c.run.CreationTimestamp.UTC().Format(time.RFC3339Nano)
		}
		if t := c.run.Status.CompletionTime; t != nil {
			st.FinishedAt = t.UTC().Format(time.RFC3339Nano)
		}
		if c.run.Status.Phase.Terminal() && c.run.Status.Phase != v1alpha1.PhaseSucceeded {
			st.Error = bounds.Echo(c.run.Status.Message)
		}
	}
	argv := c.argv()
	out := container.InspectResponse{
		ID: c.id, Created: c.meta.Created.Format(time.RFC3339Nano), State: st, Image: c.meta.Image, Name: "/" + c.name,
		Driver: "stoke", Platform: "linux",
		HostConfig: &container.HostConfig{AutoRemove: c.meta.AutoRemove},
		Config: &container.Config{Image: c.meta.Image, Cmd: c.meta.Cmd, Entrypoint: c.meta.Entrypoint, Env: c.env,
			Labels: c.meta.Labels, StopSignal: c.meta.StopSignal, StopTimeout: c.meta.StopTimeout,
			Tty: c.meta.Tty, OpenStdin: c.meta.OpenStdin, StdinOnce: c.meta.StdinOnce},
		Mounts: []container.MountPoint{},
	}
	if len(argv) > 0 {
		out.Path, out.Args = argv[0], argv[1:]
	}
	if cs := c.meta.ConsoleSize; len(cs) == 2 {
		out.HostConfig.ConsoleSize = [2]uint{cs[0], cs[1]}
	}
	return out
}

func (s *Server) containerList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	all, _ := strconv.ParseBool(q.Get("all"))
	f, err := parseFilters(q.Get("filters"))
	if err != nil {
		writeError(w, err)
		return
	}
	// A status filter other than running looks at every container, as
	// Docker does.
	if st := f["status"]; len(st) > 0 && !(len(st) == 1 && st[0] == "running") {
		all = true
	}
	limit := -1
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil {
			writeError(w, errdefs.InvalidArgument("limit", "is not a number"))
			return
		}
	}
	out := []container.Summary{}
	for _, c := range s.containers(all) {
		if !f.match(c) {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, s.summary(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) summary(c *ctr) container.Summary {
	status := "Created"
	switch c.state() {
	case container.StateRunning:
		since := c.meta.Created
		if t := c.run.Status.StartTime; t != nil {
			since = t.Time
		}
		status = "Up " + humanDuration(time.Since(since))
	case container.StateExited:
		ago := time.Duration(0)
		if t := c.run.Status.CompletionTime; t != nil {
			ago = time.Since(t.Time)
		}
		status = fmt.Sprintf("Exited (%d) %s ago", c.exitCode(), humanDuration(ago))
	}
	rule, n, _ := s.resolve(c.meta.Image)
	return container.Summary{ID: c.id, Names: []string{"/" + c.name}, Image: c.meta.Image, ImageID: imageID(n, rule),
		Command: strings.Join(c.argv(), " "), Created: c.meta.Created.Unix(), Labels: c.meta.Labels,
		State: c.state(), Status: status, Ports: []container.PortSummary{}, Mounts: []container.MountPoint{}}
}

func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return "Less than a second"
	case d < time.Minute:
		return fmt.Sprintf("%d seconds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d minutes", int(d.Minutes()))
	}
	return fmt.Sprintf("%d hours", int(d.Hours()))
}

// filters are Docker's list filters, {"status": ["exited"], ...}.
type filters map[string][]string

// parseFilters reads the JSON of ?filters: {"key": ["v"]} or the older
// {"key": {"v": true}}.
func parseFilters(raw string) (filters, error) {
	return parseFiltersOf(raw, "status", "label", "name", "id", "ancestor")
}

// parseFiltersOf reads filters whose keys are among keys.
func parseFiltersOf(raw string, keys ...string) (filters, error) {
	f := filters{}
	if raw == "" {
		return f, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, errdefs.InvalidArgument("filters", "is not JSON: %s", bounds.Truncate(err.Error(), bounds.Quoted))
	}
	for k, v := range m {
		var list []string
		if err := json.Unmarshal(v, &list); err != nil {
			var set map[string]bool
			if err := json.Unmarshal(v, &set); err != nil {
				return nil, errdefs.InvalidArgument("filters", "%s: want a list or a set of strings", bounds.Truncate(k, bounds.Quoted))
			}
			for s := range set {
				list = append(list, s)
			}
		}
		if !slices.Contains(keys, k) {
			return nil, errdefs.InvalidArgument("filters", "invalid filter '%s'", bounds.Truncate(k, bounds.Quoted))
		}
		f[k] = list
	}
	return f, nil
}

// match reports whether c passes every filter (any value of each).
func (f filters) match(c *ctr) bool {
	for k, vals := range f {
		ok := false
		for _, v := range vals {
			switch k {
			case "status":
				ok = ok || string(c.state()) == v
			case "id":
				ok = ok || strings.HasPrefix(c.id, v)
			case "name":
				ok = ok || strings.Contains(c.name, strings.TrimPrefix(v, "/"))
			case "ancestor":
				ok = ok || c.meta.Image == NormalizeImage(v)
			case "label":
				lk, lv, hasValue := strings.Cut(v, "=")
				have, present := c.meta.Labels[lk]
				ok = ok || (present && (!hasValue || have == lv))
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func (s *Server) containerRemove(w http.ResponseWriter, r *http.Request) {
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if c.running() && !force {
		writeError(w, errdefs.Errorf(errdefs.ErrAlreadyExists, "cannot remove container %q: container is running: stop the container before removing or force remove", "/"+c.name))
		return
	}
	if err := s.remove(r, c); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// remove deletes a container's Run (a running task is killed as it goes;
// a created one's held Run never ran).
func (s *Server) remove(r *http.Request, c *ctr) error {
	run := c.run
	if run == nil {
		run = c.held
	}
	if _, err := s.cfg.Backend.DeleteRun(r.Context(), run.Namespace, run.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	s.execs.dropContainer(c.id)
	s.log.Info("docker: container removed", "container", c.id[:12], "run_uid", run.UID)
	return nil
}

func joinArgv(argv []string) string { return strings.Join(argv, " ") }
