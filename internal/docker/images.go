package docker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	"github.com/moby/moby/api/types/image"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// ImageRule maps the image references matching Image (a path.Match
// pattern on the normalised reference, "python:*") to a Runtime, with the
// command a container runs when it names none.
type ImageRule struct {
	Image   string   `json:"image"`
	Runtime string   `json:"runtime"`
	Cmd     []string `json:"cmd,omitempty"`
	// Interpreter, when set, says the Runtime runs its tasks' arguments
	// with an interpreter of its own (the python Runtime: python3 ARGS): a
	// command's first word must match this pattern ("python*"), and is
	// dropped.
	Interpreter string `json:"interpreter,omitempty"`
}

// taskArgs are the task Run's arguments for a container's command.
func (r ImageRule) taskArgs(argv []string) ([]string, error) {
	if r.Interpreter == "" {
		return argv, nil
	}
	if ok, _ := path.Match(r.Interpreter, path.Base(argv[0])); !ok {
		return nil, errdefs.InvalidArgument("Cmd", "the %s Runtime runs %s: the command must start with it, not %s", r.Runtime, r.Interpreter, bounds.Truncate(argv[0], bounds.Quoted))
	}
	if len(argv) == 1 {
		return []string{"-"}, nil // the program from stdin, which is empty
	}
	return argv[1:], nil
}

// ImageTable is the images file: its rules, the first match wins.
type ImageTable struct {
	Images []ImageRule `json:"images"`
}

// LabelRuntime is the label `docker image inspect` shows the mapping in.
const LabelRuntime = "dev.stoke.runtime"

// Images resolves image references to Runtimes. In standalone an image
// only selects a Runtime: its filesystem is not used.
type Images struct {
	rules []ImageRule
	mu    sync.Mutex
	// pulled are the references pulled or run, which `docker images`
	// lists besides the rules without a wildcard (bounded).
	pulled []string
}

// DefaultImages maps python images to the python Runtime and bash, debian,
// ubuntu, alpine and busybox images to the bash Runtime.
func DefaultImages() *Images {
	bash := []string{"bash"}
	return &Images{rules: []ImageRule{
		{Image: "python:*", Runtime: "python", Cmd: []string{"python3"}, Interpreter: "python*"},
		{Image: "bash:*", Runtime: "bash", Cmd: bash},
		{Image: "debian:*", Runtime: "bash", Cmd: bash},
		{Image: "ubuntu:*", Runtime: "bash", Cmd: bash},
		{Image: "alpine:*", Runtime: "bash", Cmd: []string{"sh"}},
		{Image: "busybox:*", Runtime: "bash", Cmd: []string{"sh"}},
	}}
}

// LoadImages reads an images file (YAML or JSON, an ImageTable).
func LoadImages(file string) (*Images, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("docker images file: %w", err)
	}
	var t ImageTable
	if err := yaml.UnmarshalStrict(b, &t); err != nil {
		return nil, fmt.Errorf("docker images file %s: %w", file, err)
	}
	for i, r := range t.Images {
		if _, err := path.Match(r.Image, ""); err != nil || r.Image == "" {
			return nil, fmt.Errorf("docker images file %s: images[%d].image %q is not a pattern", file, i, r.Image)
		}
		if r.Runtime == "" {
			return nil, fmt.Errorf("docker images file %s: images[%d].runtime is empty", file, i)
		}
	}
	return &Images{rules: t.Images}, nil
}

// NormalizeImage is a reference as the rules see it: without Docker Hub's
// registry and library/ prefix, with a tag (":latest" when none).
func NormalizeImage(ref string) string {
	for _, p := range []string{"docker.io/", "index.docker.io/", "registry-1.docker.io/"} {
		ref = strings.TrimPrefix(ref, p)
	}
	ref = strings.TrimPrefix(ref, "library/")
	name := ref
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		name = ref[i+1:]
	}
	if !strings.ContainsAny(name, ":@") {
		ref += ":latest"
	}
	return ref
}

// Resolve finds the rule of an image reference, or Docker's "No such
// image" (NotFound).
func (im *Images) Resolve(ref string) (ImageRule, string, error) {
	if ref == "" || len(ref) > bounds.Arg {
		return ImageRule{}, "", errdefs.InvalidArgument("Image", "must be an image reference of at most %d bytes", bounds.Arg)
	}
	n := NormalizeImage(ref)
	for _, r := range im.rules {
		if ok, _ := path.Match(r.Image, n); ok {
			return r, n, nil
		}
	}
	return ImageRule{}, "", noSuchImage(ref)
}

// maxPulled bounds the references `docker images` remembers.
const maxPulled = 256

// remember adds a reference to what `docker images` lists.
func (im *Images) remember(ref string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if slices.Contains(im.pulled, ref) {
		return
	}
	if len(im.pulled) == maxPulled {
		im.pulled = im.pulled[1:]
	}
	im.pulled = append(im.pulled, ref)
}

// List is the references `docker images` shows: each rule without a
// wildcard, and those pulled or run since start.
func (im *Images) List() []string {
	var refs []string
	for _, r := range im.rules {
		if !strings.ContainsAny(r.Image, "*?[") {
			refs = append(refs, r.Image)
		}
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	for _, p := range im.pulled {
		if !slices.Contains(refs, p) {
			refs = append(refs, p)
		}
	}
	return refs
}

// imageID is a stable ID for a reference and its Runtime.
func imageID(ref string, r ImageRule) string {
	sum := sha256.Sum256([]byte(ref + "\x00" + r.Runtime + "\x00" + strings.Join(r.Cmd, "\x00")))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// started is when this process began: the images' creation time.
var started = time.Now().UTC()

func (s *Server) imageInspect(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("name")
	rule, n, err := s.resolve(ref)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, image.InspectResponse{
		ID:       imageID(n, rule),
		RepoTags: []string{n},
		Comment:  fmt.Sprintf("selects the Stoke Runtime %q; the image's filesystem is not used", rule.Runtime),
		Created:  started.Format(time.RFC3339Nano),
		Config: &dockerspec.DockerOCIImageConfig{ImageConfig: ocispec.ImageConfig{
			Cmd: rule.Cmd, Labels: map[string]string{LabelRuntime: rule.Runtime}}},
		Architecture: "amd64",
		Os:           "linux",
	})
}

func (s *Server) imageList(w http.ResponseWriter, _ *http.Request) {
	out := []image.Summary{}
	for _, ref := range s.cfg.Images.List() {
		rule, n, err := s.resolve(ref)
		if err != nil {
			continue
		}
		out = append(out, image.Summary{ID: imageID(n, rule), RepoTags: []string{n}, RepoDigests: []string{},
			Created: started.Unix(), Labels: map[string]string{LabelRuntime: rule.Runtime}, Containers: -1, SharedSize: -1})
	}
	writeJSON(w, http.StatusOK, out)
}

// imagePull is `docker pull`: a mapped image is there at once; an
// unmapped one is Docker's 404.
func (s *Server) imagePull(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ref := q.Get("fromImage")
	if tag := q.Get("tag"); tag != "" {
		if strings.HasPrefix(tag, "sha256:") {
			ref += "@" + tag
		} else {
			ref += ":" + tag
		}
	}
	rule, n, err := s.resolve(ref)
	if err != nil {
		writeError(w, err)
		return
	}
	s.cfg.Images.remember(n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	name, tag, _ := strings.Cut(n, ":")
	for _, m := range []map[string]string{
		{"status": "Pulling from " + name, "id": tag},
		{"status": "Digest: " + imageID(n, rule)},
		{"status": fmt.Sprintf("Status: Image is up to date for %s (Stoke Runtime %s)", n, rule.Runtime)},
	} {
		writeJSONLine(w, m)
	}
}
