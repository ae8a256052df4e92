package lambda

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/lambda/payload"
)

// Tags Stoke puts on every function it creates.
const (
	TagRunUID = "stoke.dev/run-uid"
	TagDigest = "stoke.dev/digest"
)

// zipTime is every entry's modification time, so that the same inputs make
// the same bytes and therefore the same digest.
var zipTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// bootstrapEntries are the bootstrap binaries deflated once per process,
// by path: every package copies the entry raw instead of compressing tens
// of megabytes again.
var bootstrapEntries sync.Map // path → *bootstrapEntry

func bootstrapFor(path string) *bootstrapEntry {
	e, _ := bootstrapEntries.LoadOrStore(path, &bootstrapEntry{path: path})
	return e.(*bootstrapEntry)
}

// bootstrapEntry is one bootstrap binary as a deflated zip entry.
type bootstrapEntry struct {
	path string

	once sync.Once
	hdr  zip.FileHeader
	data []byte // deflated
	err  error
}

func (b *bootstrapEntry) load() error {
	b.once.Do(func() {
		raw, err := os.ReadFile(b.path)
		if err != nil {
			b.err = fmt.Errorf("bootstrap binary: %w", err)
			return
		}
		var buf bytes.Buffer
		fw, _ := flate.NewWriter(&buf, flate.BestSpeed)
		_, _ = fw.Write(raw)
		_ = fw.Close()
		b.hdr = zip.FileHeader{Name: "bootstrap", Method: zip.Deflate, Modified: zipTime,
			CRC32: crc32.ChecksumIEEE(raw), CompressedSize64: uint64(buf.Len()), UncompressedSize64: uint64(len(raw))}
		b.hdr.SetMode(0o755)
		b.data = buf.Bytes()
	})
	return b.err
}

// spec is what one function is made of.
type spec struct {
	Runtime      string            `json:"runtime"` // inner: bash or python
	Handler      string            `json:"handler"` // empty for a task function
	Env          map[string]string `json:"env"`
	Role         string            `json:"role"`
	Architecture string            `json:"architecture"`
	MemoryMB     int32             `json:"memoryMB"`
	TimeoutSecs  int32             `json:"timeoutSeconds"`
	// LambdaRuntime is a zip function's Lambda runtime (lambdaRuntime);
	// Image an image function's image, "" for a zip.
	LambdaRuntime string `json:"lambdaRuntime,omitempty"`
	Image         string `json:"image,omitempty"`
}

// spec is the spec of a function of this server with handler ("" for a
// task), the Run's env and timeout.
func (s *Server) spec(handler string, env map[string]string, timeoutSecs int32) spec {
	sp := spec{Runtime: s.cfg.Runtime, Handler: handler, Env: env, Role: s.cfg.Role, Architecture: s.cfg.Architecture,
		MemoryMB: s.cfg.MemoryMB, TimeoutSecs: timeoutSecs, Image: s.cfg.Image}
	if sp.Image == "" {
		sp.LambdaRuntime = lambdaRuntime(sp.Runtime)
	}
	return sp
}

// pkg is a built deployment package.
type pkg struct {
	zip    []byte
	digest string // hex sha256 over the zip and the spec
	name   string // the function name, derived from the digest
	env    map[string]string
	spec   spec
	// deps are the entries a python Run's requirements put at the
	// package's root: not the workspace's, never written back.
	deps map[string]bool
}

// build makes the deployment zip of dir in memory: the bootstrap, every
// regular file under dir and, for python with a requirements cache, what
// dir's requirements.txt lists (installed for Lambda's platform, at the
// package's root, which Python imports from). It refuses, with a clear
// error and before any AWS call, a package or environment past Lambda's
// limits.
func (s *Server) build(ctx context.Context, dir string, sp spec) (*pkg, error) {
	env, err := functionEnv(sp)
	if err != nil {
		return nil, err
	}
	if sp.Image != "" {
		return s.imagePackage(dir, sp, env)
	}
	if err := s.boot.load(); err != nil {
		return nil, err
	}
	var files []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the source: %w", err)
	}
	slices.Sort(files)
	type entry struct{ path, rel string }
	entries := make([]entry, 0, len(files))
	names := make(map[string]bool, len(files))
	for _, path := range files {
		rel, _ := filepath.Rel(dir, path)
		entries = append(entries, entry{path, rel})
		names[rel] = true
	}
	var depNames map[string]bool
	if s.deps != nil && sp.Runtime == "python" {
		depsDir, err := s.deps.Dir(ctx, dir)
		if err != nil {
			return nil, err
		}
		if depsDir != "" {
			var deps []entry
			err := filepath.WalkDir(depsDir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return err
				}
				rel, _ := filepath.Rel(depsDir, path)
				if names[rel] {
					return errdefs.InvalidArgument("source", "%s is both a file of the source and of a package its requirements.txt installs", rel)
				}
				deps = append(deps, entry{path, rel})
				return nil
			})
			if err != nil {
				return nil, err
			}
			slices.SortFunc(deps, func(a, b entry) int { return strings.Compare(a.rel, b.rel) })
			entries = append(entries, deps...)
			depNames = make(map[string]bool, len(deps))
			for _, d := range deps {
				depNames[filepath.ToSlash(d.rel)] = true
			}
		}
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	// A copy: CreateRaw writes to the header, which every build shares.
	hdr := s.boot.hdr
	w, err := zw.CreateRaw(&hdr)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(s.boot.data); err != nil {
		return nil, err
	}
	unzipped := int64(s.boot.hdr.UncompressedSize64)
	for _, e := range entries {
		path, rel := e.path, e.rel
		if rel == "bootstrap" {
			return nil, errdefs.InvalidArgument("source", "a file named bootstrap is reserved for Stoke's bootstrap")
		}
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		unzipped += fi.Size()
		if unzipped > bounds.LambdaUnzipped {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "the Lambda package would unzip to more than %d bytes, Lambda's limit", bounds.LambdaUnzipped)
		}
		hdr := &zip.FileHeader{Name: filepath.ToSlash(rel), Method: zip.Deflate, Modified: zipTime}
		hdr.SetMode(fi.Mode().Perm() | 0o444)
		fw, err := zw.CreateHeader(hdr)
		if err != nil {
			return nil, err
		}
		if err := copyFile(fw, path); err != nil {
			return nil, err
		}
		if buf.Len() > bounds.LambdaZip {
			break // refused below without compressing the rest
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > bounds.LambdaZip {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge,
			"the Lambda package is over %d bytes zipped (Lambda's limit for a direct upload); the bootstrap alone is %d bytes",
			bounds.LambdaZip, len(s.boot.data))
	}
	h := sha256.New()
	h.Write(buf.Bytes())
	canon, _ := json.Marshal(sp) // strings, ints and a map: cannot fail; map keys are sorted
	h.Write(canon)
	digest := hex.EncodeToString(h.Sum(nil))
	// Lambda names are at most 64 characters.
	name := s.cfg.NamePrefix + digest[:min(len(digest), 64-len(s.cfg.NamePrefix))]
	return &pkg{zip: buf.Bytes(), digest: digest, name: name, env: env, spec: sp, deps: depNames}, nil
}

// imagePackage is the package of an image function: nothing to upload,
// the image holds the code. A Run that brings files of its own is refused,
// since they would never reach the function.
func (s *Server) imagePackage(dir string, sp spec, env map[string]string) (*pkg, error) {
	var first string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			first = path
			return filepath.SkipAll
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the source: %w", err)
	}
	if first != "" {
		rel, _ := filepath.Rel(dir, first)
		return nil, errdefs.InvalidArgument("source", "the functions of this Runtime run the code in the image %s, so a Run's source (%s) would never reach them: build it into the image, or leave spec.source out", sp.Image, rel)
	}
	canon, _ := json.Marshal(sp) // see build
	sum := sha256.Sum256(canon)
	digest := hex.EncodeToString(sum[:])
	name := s.cfg.NamePrefix + digest[:min(len(digest), 64-len(s.cfg.NamePrefix))]
	return &pkg{digest: digest, name: name, env: env, spec: sp}, nil
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// functionEnv is the function's environment: the Run's env, the inner
// runtime and the list of the Run's own keys for the bootstrap; at most
// bounds.LambdaEnv bytes, as on Lambda.
func functionEnv(sp spec) (map[string]string, error) {
	env := make(map[string]string, len(sp.Env)+2)
	keys := make([]string, 0, len(sp.Env))
	for k, v := range sp.Env {
		if reservedEnv(k) {
			return nil, errdefs.InvalidArgument("env", "%s is reserved by Lambda or Stoke", k)
		}
		env[k] = v
		keys = append(keys, k)
	}
	slices.Sort(keys)
	env[payload.EnvRuntime] = sp.Runtime
	switch {
	case sp.Image != "" && sp.Handler != "":
		env[payload.EnvHandler] = sp.Handler
	case sp.Image == "" && sp.LambdaRuntime != string(types.RuntimeProvidedal2023):
		// A managed runtime starts the bootstrap as its wrapper.
		env["AWS_LAMBDA_EXEC_WRAPPER"] = ExecWrapper
	}
	if len(keys) > 0 {
		env[payload.EnvUserKeys] = strings.Join(keys, ",")
	}
	size := 0
	for k, v := range env {
		size += len(k) + len(v)
	}
	if size > bounds.LambdaEnv {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "env: %d bytes, Lambda allows %d bytes of environment variables", size, bounds.LambdaEnv)
	}
	return env, nil
}

// reservedEnv: keys Lambda refuses in a function's environment, and
// Stoke's own.
func reservedEnv(k string) bool {
	switch k {
	case "_HANDLER", "_X_AMZN_TRACE_ID", "AWS_REGION", "AWS_EXECUTION_ENV", "AWS_LAMBDA_FUNCTION_NAME",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "AWS_LAMBDA_FUNCTION_VERSION", "AWS_LAMBDA_INITIALIZATION_TYPE",
		"AWS_LAMBDA_LOG_GROUP_NAME", "AWS_LAMBDA_LOG_STREAM_NAME", "AWS_ACCESS_KEY", "AWS_ACCESS_KEY_ID",
		"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_LAMBDA_RUNTIME_API", "LAMBDA_TASK_ROOT",
		"LAMBDA_RUNTIME_DIR", "AWS_LAMBDA_EXEC_WRAPPER", payload.EnvRuntime, payload.EnvUserKeys, payload.EnvHandler:
		return true
	}
	return false
}
