// Package datadir knows where standalone Stoke keeps its state and its API
// token, so that `stoke up` and every client command agree without flags on
// one machine.
package datadir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"stoke.dev/stoke/internal/runuser"
)

// DefaultListen is the address `stoke up` serves its HTTP API on, and the
// one clients call when told nothing else.
const DefaultListen = "127.0.0.1:7070"

// tokenFile is the API token's file name inside the data directory.
const tokenFile = "token"

// System is the data directory of a root Stoke with no $XDG_STATE_HOME:
// the Runs' unprivileged user must pass through every directory above it
// to reach its working directories, which it cannot in root's home
// (mode 0700).
const System = "/var/lib/stoke"

// Default is the user's state directory for Stoke: $XDG_STATE_HOME/stoke,
// else ~/.local/state/stoke, but System for root.
func Default() (string, error) {
	return defaultFor(os.Geteuid())
}

func defaultFor(euid int) (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "stoke"), nil
	}
	if euid == 0 {
		return System, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no data directory: %w (pass --data-dir)", err)
	}
	return filepath.Join(home, ".local", "state", "stoke"), nil
}

// Prepare creates the data directory dir (mode 0700) if it does not exist
// and refuses one that another user could use: it holds every Run's source
// and output and the API token, so it must belong to this user and be
// closed to group and others. The error says how to fix it.
//
// With runAs, the unprivileged user a root stoke up runs the Runs as, dir
// is a passage instead (mode 0710, group runAs's: it can go through to its
// working directories, never list or read what else is there), and every
// directory above dir must let it pass.
func Prepare(dir string, runAs *runuser.User) error {
	if runAs != nil {
		if err := runAs.Reaches(filepath.Dir(dir)); err != nil {
			return fmt.Errorf("the data directory %s: %w; choose one it can reach, such as %s (--data-dir)", dir, err, System)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("the data directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("the data directory %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("the data directory %s belongs to uid %d, not to this user (uid %d): use a directory of your own (--data-dir)", dir, st.Uid, os.Geteuid())
	}
	perm, passage := fi.Mode().Perm(), false
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && runAs != nil && st.Gid == runAs.GID {
		passage = perm&0o077 == 0o010 // left so by an earlier start
	}
	if perm&0o077 != 0 && !passage {
		return fmt.Errorf("the data directory %s has mode %#o: other users could read or change every Run's source and the API token; make it private with: chmod 700 %s", dir, perm, dir)
	}
	return runAs.Passage(dir)
}

// DebugSocket is where `stoke up` on the data directory dir serves Go's
// profiles by default (internal/debugsock): up.sock in the directory
// debug, which the server makes 0700.
func DebugSocket(dir string) string { return filepath.Join(dir, "debug", "up.sock") }

// DockerSocket is where `stoke up` on the data directory dir serves the
// Docker Engine API by default: docker.sock in the directory docker, which
// the server makes 0700.
func DockerSocket(dir string) string { return filepath.Join(dir, "docker", "docker.sock") }

// TokenPath is the token file of the data directory dir.
func TokenPath(dir string) string { return filepath.Join(dir, tokenFile) }

// ReadToken reads the API token of the data directory dir.
func ReadToken(dir string) (string, error) {
	b, err := os.ReadFile(TokenPath(dir))
	if err != nil {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("the API token file %s is empty", TokenPath(dir))
	}
	return tok, nil
}

// EnsureToken returns the data directory's API token, creating a random one
// (mode 0600) on first start. An existing token file readable by others is
// refused rather than used.
func EnsureToken(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating the data directory: %w", err)
	}
	path := TokenPath(dir)
	fi, err := os.Stat(path)
	switch {
	case err == nil:
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("the API token file %s has mode %v; it must be readable by its owner only (chmod 600)", path, fi.Mode().Perm())
		}
		return ReadToken(dir)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	// O_EXCL: two first starts racing keep one token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return ReadToken(dir)
	}
	if err != nil {
		return "", fmt.Errorf("creating the API token: %w", err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("writing the API token: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("writing the API token: %w", err)
	}
	return tok, nil
}

// urlFile holds the base URL the running `stoke up` serves on, so that
// clients on this machine find it when --listen was not the default.
const urlFile = "url"

// WriteURL records the API's base URL in the data directory dir.
func WriteURL(dir, url string) error {
	tmp := filepath.Join(dir, urlFile+".tmp")
	if err := os.WriteFile(tmp, []byte(url+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the API URL: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, urlFile)); err != nil {
		return fmt.Errorf("recording the API URL: %w", err)
	}
	return nil
}

// ReadURL reads the API's base URL recorded in dir; it wraps
// fs.ErrNotExist when none is.
func ReadURL(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, urlFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
