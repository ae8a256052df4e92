// Package cpuprofile lets every Stoke process write a CPU profile of its
// own life, for finding where a path's time goes across processes (stoke
// up and its Runtime Server pods are separate processes that a test or a
// benchmark cannot profile from inside).
//
// It is off unless the environment names a directory in EnvVar; the pods
// inherit stoke up's environment, so one variable profiles them all.
package cpuprofile

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// EnvVar names the directory that receives one profile per process,
// <role>-<pid>.pprof, written when the process ends normally.
const EnvVar = "STOKE_CPU_PROFILE_DIR"

// Start begins profiling this process as role when EnvVar is set, and
// returns the function that stops and writes the profile (a no-op when it
// is not). The directory must exist and be the caller's alone (0700): a
// profile shows function names and timings, nothing of a Run's data.
func Start(role string) (stop func(), err error) {
	dir := os.Getenv(EnvVar)
	if dir == "" {
		return func() {}, nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: %s must be a directory that only its owner can use (chmod 700)", EnvVar, dir)
	}
	name := filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", role, os.Getpid()))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
