// Package gittest serves real git repositories to tests: the git CLI's own
// git http-backend behind net/http/cgi on a loopback port, optionally
// behind HTTP Basic authentication. It stands in for a git host (GitHub,
// GitLab): it does not model their rate limits, redirects or
// token scopes.
package gittest

import (
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// Server is a git smart-HTTP server on loopback.
type Server struct {
	// URL is the server's root: a repository NAME is URL + "/NAME.git".
	URL  string
	root string
	work string
	// Fetches counts the upload-pack requests (fetches and ls-remotes).
	Fetches atomic.Int64
	// Authorizations are the Authorization headers the server saw.
	authorizations atomic.Pointer[[]string]
}

// Options of NewServer.
type Options struct {
	// User and Password, when set, are required of every request.
	User, Password string
}

// NewServer starts a server that t's cleanup stops.
func NewServer(t testing.TB, o Options) *Server {
	t.Helper()
	backend, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	s := &Server{root: t.TempDir(), work: t.TempDir()}
	cgiHandler := &cgi.Handler{
		Path:   filepath.Join(strings.TrimSpace(string(backend)), "git-http-backend"),
		Env:    []string{"GIT_PROJECT_ROOT=" + s.root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + s.work},
		Stderr: io.Discard, // its complaints reach the client, which the tests read
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Authorization"); a != "" {
			for {
				old := s.authorizations.Load()
				var next []string
				if old != nil {
					next = append(next, *old...)
				}
				next = append(next, a)
				if s.authorizations.CompareAndSwap(old, &next) {
					break
				}
			}
		}
		if o.User != "" {
			u, p, ok := r.BasicAuth()
			if !ok || u != o.User || p != o.Password {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "authentication required", http.StatusUnauthorized)
				return
			}
		}
		if strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			s.Fetches.Add(1)
		}
		cgiHandler.ServeHTTP(w, r)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.URL = "http://" + l.Addr().String()
	return s
}

// Authorizations returns the Authorization headers seen so far.
func (s *Server) Authorizations() []string {
	if p := s.authorizations.Load(); p != nil {
		return *p
	}
	return nil
}

// Commit commits files (path → content; a content starting with "link:"
// makes a symbolic link to the rest; a path ending in ".sh" is
// executable) on top of branch main of repository name, made when
// missing, and returns the commit ID and the repository's URL.
func (s *Server) Commit(t testing.TB, name string, files map[string]string) (commit, url string) {
	t.Helper()
	bare := filepath.Join(s.root, name+".git")
	work := filepath.Join(s.work, name)
	if _, err := os.Stat(bare); os.IsNotExist(err) {
		s.git(t, "", "init", "-q", "--bare", "-b", "main", bare)
		s.git(t, "", "init", "-q", "-b", "main", work)
	}
	for p, content := range files {
		full := filepath.Join(work, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(full)
		if target, ok := strings.CutPrefix(content, "link:"); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	s.git(t, work, "add", "-A")
	s.git(t, work, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "--allow-empty", "-m", "commit")
	s.git(t, work, "push", "-q", bare, "HEAD:refs/heads/main")
	commit = strings.TrimSpace(s.git(t, work, "rev-parse", "HEAD"))
	return commit, s.URL + "/" + name + ".git"
}

// Tag tags commit in repository name (an annotated tag).
func (s *Server) Tag(t testing.TB, name, tag, commit string) {
	t.Helper()
	work := filepath.Join(s.work, name)
	s.git(t, work, "-c", "user.name=test", "-c", "user.email=test@example.com", "tag", "-a", "-m", tag, tag, commit)
	s.git(t, work, "push", "-q", filepath.Join(s.root, name+".git"), "refs/tags/"+tag)
}

func (s *Server) git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
