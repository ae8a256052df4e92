// Package outputs parses and validates the small KEY=VALUE results a task or
// invocation reports (64 keys, key 128 bytes, value 8 KiB, 64 KiB in all,
// valid UTF-8: internal/bounds). The same rules apply to task status.outputs and to
// function invocation outputs.
package outputs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// maxFile is the largest outputs file worth reading: the total bound plus
// one '=' and one newline per key.
const maxFile = bounds.OutputsTotal + 2*bounds.OutputKeys

// ReadFile parses the outputs file at path: ReadFileAt relative to the
// working directory.
func ReadFile(path string) (map[string]string, error) {
	return ReadFileAt(unix.AT_FDCWD, path)
}

// ReadFileAt parses the outputs file ($STOKE_OUTPUTS) name in the directory
// open as dirfd; a missing file means no outputs. Only a regular file is
// read: the open neither follows a symbolic link (it could point anywhere)
// nor blocks on a FIFO, and a file with a second link (a hard link) is
// refused. Opening a name in an open directory also spares the
// walk of a full path, which the Bash runtime does on every invocation.
func ReadFileAt(dirfd int, name string) (map[string]string, error) {
	data, err := readAt(dirfd, name, "$STOKE_OUTPUTS", maxFile)
	if err != nil || data == nil {
		return nil, err
	}
	return Parse(data)
}

// readAt reads the file name in dirfd, which a Run wrote as the file of
// variable v, up to max bytes; a missing file is nil data.
func readAt(dirfd int, name, v string, max int) ([]byte, error) {
	f, err := openAt(dirfd, name, v)
	if f == nil || err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("outputs: %w", err)
	}
	if len(data) > max {
		if v == "$STOKE_OUTPUTS" {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "outputs: more than %d bytes in all", bounds.OutputsTotal)
		}
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "outputs: %s holds more than %d bytes", v, max)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// openAt opens a file a task wrote, refusing what a server running as
// root must not read for it: a symbolic link, a file with a second name,
// anything but a regular file. It returns nil, nil when there is none.
func openAt(dirfd int, name, v string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	switch {
	case err == unix.ENOENT:
		return nil, nil
	case err == unix.ELOOP:
		return nil, fmt.Errorf("outputs: %s is a symbolic link", v)
	case err != nil:
		return nil, fmt.Errorf("outputs: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("outputs: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("outputs: %s is not a regular file (%s)", v, fi.Mode().Type())
	}
	// A second name for the file could be a link to a file the Run cannot
	// read itself, which a server running as root would read for it.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		f.Close()
		return nil, fmt.Errorf("outputs: %s has more than one link", v)
	}
	return f, nil
}

// Parse reads KEY=VALUE lines. Blank lines are skipped; a later line for the
// same key replaces the earlier one; a final line needs no newline. The value
// is everything after the first '='.
func Parse(data []byte) (map[string]string, error) {
	out := map[string]string{}
	for lineNo := 1; len(data) > 0; lineNo++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		eq := bytes.IndexByte(line, '=')
		if eq < 0 {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "outputs line %d: want KEY=VALUE", lineNo)
		}
		out[string(line[:eq])] = string(line[eq+1:])
	}
	if err := Validate(out); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// Validate checks an outputs map against the bounds and the key syntax.
func Validate(m map[string]string) error {
	if len(m) > bounds.OutputKeys {
		return errdefs.Errorf(errdefs.ErrTooLarge, "outputs: %d keys, at most %d allowed", len(m), bounds.OutputKeys)
	}
	total := 0
	for k, v := range m {
		if err := ValidateKey(k); err != nil {
			return err
		}
		if len(v) > bounds.OutputValue {
			return errdefs.Errorf(errdefs.ErrTooLarge, "outputs: value of %q is %d bytes, at most %d allowed", k, len(v), bounds.OutputValue)
		}
		if !utf8.ValidString(v) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "outputs: value of %q is not valid UTF-8", k)
		}
		total += len(k) + len(v)
	}
	if total > bounds.OutputsTotal {
		return errdefs.Errorf(errdefs.ErrTooLarge, "outputs: %d bytes in all, at most %d allowed", total, bounds.OutputsTotal)
	}
	return nil
}

// ValidateKey checks one key: 1–128 bytes of [A-Za-z0-9_.-], not starting
// with a digit, '.' or '-'.
func ValidateKey(k string) error {
	if k == "" {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "outputs: empty key")
	}
	if len(k) > bounds.OutputKey {
		return errdefs.Errorf(errdefs.ErrTooLarge, "outputs: key %.32q… is %d bytes, at most %d allowed", k, len(k), bounds.OutputKey)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		ok := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			(i > 0 && ((c >= '0' && c <= '9') || c == '.' || c == '-'))
		if !ok {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "outputs: key %q: want letters, digits, '_', '.' or '-', starting with a letter or '_'", k)
		}
	}
	return nil
}
