package docker

import (
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/system"

	"stoke.dev/stoke/internal/errdefs"
)

// The API versions served: from what Debian's docker.io CLI speaks to the
// newest github.com/moby/moby/api describes.
const (
	MinAPIVersion = "1.41"
	APIVersion    = "1.57"
)

// versionPrefix is a versioned path's prefix, /v1.NN.
var versionPrefix = regexp.MustCompile(`^/v([0-9]+)\.([0-9]+)(/.*)$`)

// negotiate splits a path into its API version (the newest when the path
// names none) and the rest, refusing a version out of range with Docker's
// own message.
func negotiate(path string) (version, rest string, err error) {
	m := versionPrefix.FindStringSubmatch(path)
	if m == nil {
		if strings.HasPrefix(path, "/v") && len(path) > 2 && path[2] >= '0' && path[2] <= '9' {
			return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid API version in path %q: want /v<major>.<minor>/", path)
		}
		return APIVersion, path, nil
	}
	version = m[1] + "." + m[2]
	switch {
	case compareVersions(version, MinAPIVersion) < 0:
		return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "client version %s is too old. Minimum supported API version is %s, please upgrade your client to a newer version", version, MinAPIVersion)
	case compareVersions(version, APIVersion) > 0:
		return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "client version %s is too new. Maximum supported API version is %s", version, APIVersion)
	}
	return version, m[3], nil
}

// compareVersions compares two "major.minor" versions.
func compareVersions(a, b string) int {
	am, an := splitVersion(a)
	bm, bn := splitVersion(b)
	if am != bm {
		return am - bm
	}
	return an - bn
}

func splitVersion(v string) (int, int) {
	major, minor, _ := strings.Cut(v, ".")
	m, err1 := strconv.Atoi(major)
	n, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || m > 1000 || n > 1000 {
		return 1000, 1000 // out of range either way
	}
	return m, n
}

// ping answers /_ping (GET and HEAD) with the newest version, which a
// client negotiates down from.
func (s *Server) ping(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("API-Version", APIVersion)
	h.Set("OSType", "linux")
	h.Set("Docker-Experimental", "false")
	h.Set("Builder-Version", "1")
	h.Set("Cache-Control", "no-cache, no-store, must-revalidate")
	h.Set("Pragma", "no-cache")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method == http.MethodHead {
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("OK"))
}

func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, system.VersionResponse{
		Platform:      system.PlatformInfo{Name: "Stoke"},
		Version:       s.cfg.Version,
		APIVersion:    APIVersion,
		MinAPIVersion: MinAPIVersion,
		Os:            runtime.GOOS,
		Arch:          runtime.GOARCH,
		GoVersion:     runtime.Version(),
		KernelVersion: kernelVersion(),
		Components: []system.ComponentVersion{{Name: "Stoke", Version: s.cfg.Version,
			Details: map[string]string{"ApiVersion": APIVersion, "MinAPIVersion": MinAPIVersion}}},
	})
}

func (s *Server) info(w http.ResponseWriter, _ *http.Request) {
	var running, stopped int
	for _, c := range s.containers(true) {
		if c.running() {
			running++
		} else {
			stopped++
		}
	}
	host, _ := os.Hostname()
	writeJSON(w, http.StatusOK, system.Info{
		ID:                "stoke",
		Containers:        running + stopped,
		ContainersRunning: running,
		ContainersStopped: stopped,
		Images:            len(s.cfg.Images.List()),
		Driver:            "stoke",
		Name:              host,
		ServerVersion:     s.cfg.Version,
		OperatingSystem:   "Stoke (an image selects a Runtime; see docs/docker.md)",
		OSType:            runtime.GOOS,
		Architecture:      runtime.GOARCH,
		NCPU:              runtime.NumCPU(),
		MemTotal:          memTotal(),
		KernelVersion:     kernelVersion(),
		SystemTime:        time.Now().Format(time.RFC3339Nano),
		LoggingDriver:     "stoke",
		CgroupVersion:     "2",
	})
}

// memTotal is the machine's memory in bytes, from /proc/meminfo.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib << 10
		}
	}
	return 0
}

func kernelVersion() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
