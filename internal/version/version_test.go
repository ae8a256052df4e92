package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	for _, tt := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"tagged, stamped", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}},
			"stoke v0.3.0, commit abc123, built with go1.26.8"},
		{"checkout with changes", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}},
			"stoke (devel), commit abc123 (modified), built with go1.26.8"},
		{"not stamped", debug.BuildInfo{GoVersion: "go1.26.8"}, "stoke (devel), commit unknown, built with go1.26.8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bi := tt.bi
			if got := From(&bi).String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// The test binary has build information too: its Go version is the
// running one.
func TestGet(t *testing.T) {
	if got := Get(); got.Go != runtime.Version() || !strings.HasPrefix(got.String(), "stoke ") {
		t.Errorf("Get() = %+v", got)
	}
}
