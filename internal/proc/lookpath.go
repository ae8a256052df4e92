package proc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrNotExecutable is LookPath's error for a file that exists but cannot be
// executed (a shell's exit status 126); any other error means not found
// (127).
var ErrNotExecutable = errors.New("not executable")

// LookPath resolves a command name the way execvp would in the child: a
// name with a slash is used as given (relative to the working directory
// dir), a bare name is searched in the child's PATH (path) — never the
// caller's own, which exec.Command would use. Relative PATH entries are
// skipped, as exec.LookPath refuses them, so the working directory cannot
// shadow a command.
func LookPath(name, dir, path string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%q: %w", name, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%q: %w", name, ErrNotExecutable)
		}
		return name, nil
	}
	found := ""
	for _, d := range filepath.SplitList(path) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
		if found == "" {
			found = p
		}
	}
	if found != "" {
		return "", fmt.Errorf("%q (%s): %w", name, found, ErrNotExecutable)
	}
	return "", fmt.Errorf("executable %q not found in PATH: %w", name, fs.ErrNotExist)
}

// ExitSignal is the signal that ended the process, or 0 when it exited.
// Only valid after Done.
func (p *Process) ExitSignal() syscall.Signal {
	if ps := p.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}
