// Package pydepstest writes wheels for tests of Python dependencies: no
// package index is reachable from the tests, so they install from a
// directory of wheels made here, each pure Python: a package of one module,
// or the files a test names.
package pydepstest

import (
	"archive/zip"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Wheel writes name-version-py3-none-any.whl into dir: a package name
// whose __init__.py is module (Python source). It returns the wheel's path.
func Wheel(dir, name, version, module string) (string, error) {
	return WheelFiles(dir, name, version, map[string]string{name + "/__init__.py": module})
}

// WheelFiles writes name-version-py3-none-any.whl into dir holding files
// (slash-separated paths at the top of the install → contents: a module
// name.py, a .pth file, a package's files), beside its metadata.
func WheelFiles(dir, name, version string, files map[string]string) (string, error) {
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", name, version))
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	info := fmt.Sprintf("%s-%s.dist-info/", name, version)
	var entries []struct{ name, body string }
	for _, p := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, struct{ name, body string }{p, files[p]})
	}
	entries = append(entries,
		struct{ name, body string }{info + "METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)},
		struct{ name, body string }{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: pydepstest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	)
	record := ""
	for _, e := range entries {
		w, err := zw.Create(e.name)
		if err != nil {
			return "", err
		}
		if _, err := w.Write([]byte(e.body)); err != nil {
			return "", err
		}
		record += e.name + ",,\n"
	}
	w, err := zw.Create(info + "RECORD")
	if err != nil {
		return "", err
	}
	if _, err := w.Write([]byte(record + info + "RECORD,,\n")); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return path, f.Close()
}
