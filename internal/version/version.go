// Package version says which build of Stoke is running: its module
// version, the commit it was built from and the Go version, from the
// build information the Go toolchain embeds in every binary.
package version

import (
	"fmt"
	"runtime/debug"
)

// Info is what a build says of itself.
type Info struct {
	// Version is the module's version: a tag for `go install
	// stoke.dev/stoke/cmd/stoke@vX`, "(devel)" for a build from a
	// checkout.
	Version string
	// Commit is the VCS revision, "unknown" when the build did not stamp
	// one (-buildvcs=false, or no checkout); Modified marks uncommitted
	// changes.
	Commit   string
	Modified bool
	// Go is the toolchain that built the binary.
	Go string
}

// Get reads the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown", Commit: "unknown", Go: "unknown"}
	}
	return From(bi)
}

// From reads a build's information.
func From(bi *debug.BuildInfo) Info {
	info := Info{Version: bi.Main.Version, Commit: "unknown", Go: bi.GoVersion}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the text `stoke version` prints: one line.
func (i Info) String() string {
	commit := i.Commit
	if i.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("stoke %s, commit %s, built with %s", i.Version, commit, i.Go)
}
