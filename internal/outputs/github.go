package outputs

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// maxGitHubFile is the largest $GITHUB_OUTPUT or $GITHUB_ENV file worth
// reading: the total bound, plus a name and a heredoc's two delimiter
// lines (GitHub's own are about 50 bytes) per key.
const maxGitHubFile = bounds.OutputsTotal + bounds.OutputKeys*(bounds.OutputKey+2*256+8)

// ReadGitHubFile reads the file at path that a task wrote as the GitHub
// Actions file command v ("$GITHUB_OUTPUT" or "$GITHUB_ENV"), in GitHub's
// format (ParseGitHub); a missing file means nothing was written. Only a
// regular file with one link is read, as ReadFileAt does.
func ReadGitHubFile(path, v string) (map[string]string, error) {
	data, err := readAt(unix.AT_FDCWD, filepath.Clean(path), v, maxGitHubFile)
	if err != nil || data == nil {
		return nil, err
	}
	return ParseGitHub(data, v)
}

// ParseGitHub reads a GitHub Actions file command ($GITHUB_OUTPUT,
// $GITHUB_ENV) as GitHub's runner does: each line is NAME=VALUE, or
// NAME<<DELIMITER followed by the value's lines up to a line that is
// exactly DELIMITER (a line with both '=' and '<<' is whichever comes
// first). Lines end with "\n" or "\r\n"; empty lines between entries are
// skipped; a later value of a name replaces the earlier. A heredoc whose
// delimiter never comes, a name that is empty, and a line that is neither
// form are errors naming the line. v names the file in errors.
func ParseGitHub(data []byte, v string) (map[string]string, error) {
	out := map[string]string{}
	lineNo := 0
	next := func() (string, bool) {
		if len(data) == 0 {
			return "", false
		}
		lineNo++
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		return string(bytes.TrimSuffix(line, []byte("\r"))), true
	}
	for {
		line, ok := next()
		if !ok {
			break
		}
		if line == "" {
			continue
		}
		eq, hd := strings.Index(line, "="), strings.Index(line, "<<")
		switch {
		case eq >= 0 && (hd < 0 || eq < hd):
			name := line[:eq]
			if name == "" {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s line %d: empty name", v, lineNo)
			}
			out[name] = line[eq+1:]
		case hd >= 0:
			name, delim, start := line[:hd], line[hd+2:], lineNo
			if name == "" || delim == "" {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s line %d: want NAME<<DELIMITER", v, lineNo)
			}
			var value []string
			for {
				l, ok := next()
				if !ok {
					return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s line %d: the delimiter %s of %s never comes",
						v, start, bounds.Quote(delim), bounds.Quote(name))
				}
				if l == delim {
					break
				}
				value = append(value, l)
			}
			out[name] = strings.Join(value, "\n")
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s line %d: want NAME=VALUE or NAME<<DELIMITER", v, lineNo)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// ValidateEnv checks what a task wrote to $GITHUB_ENV: variable names
// ([A-Za-z_][A-Za-z0-9_]*, as a later step's environment takes them),
// values without NUL, valid UTF-8, and the outputs bounds.
func ValidateEnv(m map[string]string) error {
	if len(m) > bounds.OutputKeys {
		return errdefs.Errorf(errdefs.ErrTooLarge, "$GITHUB_ENV: %d variables, at most %d allowed", len(m), bounds.OutputKeys)
	}
	total := 0
	for k, val := range m {
		if !envName(k) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "$GITHUB_ENV: %s is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", bounds.Quote(k))
		}
		switch {
		case len(k) > bounds.OutputKey:
			return errdefs.Errorf(errdefs.ErrTooLarge, "$GITHUB_ENV: name %.32q… is %d bytes, at most %d allowed", k, len(k), bounds.OutputKey)
		case len(val) > bounds.OutputValue:
			return errdefs.Errorf(errdefs.ErrTooLarge, "$GITHUB_ENV: value of %s is %d bytes, at most %d allowed", k, len(val), bounds.OutputValue)
		case strings.IndexByte(val, 0) >= 0 || !utf8.ValidString(val):
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "$GITHUB_ENV: value of %s holds a NUL byte or is not valid UTF-8", k)
		}
		total += len(k) + len(val)
	}
	if total > bounds.OutputsTotal {
		return errdefs.Errorf(errdefs.ErrTooLarge, "$GITHUB_ENV: %d bytes in all, at most %d allowed", total, bounds.OutputsTotal)
	}
	return nil
}

func envName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// Merge returns the task's outputs: $STOKE_OUTPUTS's, then
// $GITHUB_OUTPUT's over them (a name in both takes $GITHUB_OUTPUT's
// value), checked together against the bounds.
func Merge(stoke, github map[string]string) (map[string]string, error) {
	if len(github) == 0 {
		return stoke, nil
	}
	out := make(map[string]string, len(stoke)+len(github))
	for k, val := range stoke {
		out[k] = val
	}
	for k, val := range github {
		out[k] = val
	}
	if err := Validate(out); err != nil {
		return nil, fmt.Errorf("with $GITHUB_OUTPUT: %w", err)
	}
	return out, nil
}

// ReadGitHubPath reads the $GITHUB_PATH file at path: one directory a
// line, which later steps find first on PATH (GitHub's add-path file
// command). Empty lines are skipped; a directory holding ':' (which PATH
// cannot hold) or a NUL byte is an error naming its line. A missing file
// is nothing added. The file is bounded by one value's bound, which PATH
// must fit anyway.
func ReadGitHubPath(path string) ([]string, error) {
	data, err := readAt(unix.AT_FDCWD, filepath.Clean(path), "$GITHUB_PATH", bounds.OutputValue)
	if err != nil || data == nil {
		return nil, err
	}
	var dirs []string
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		switch {
		case line == "":
			continue
		case strings.ContainsAny(line, ":\x00"):
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "$GITHUB_PATH line %d: %s cannot be on PATH (it holds ':' or a NUL byte)", i+1, bounds.Quote(line))
		}
		dirs = append(dirs, line)
	}
	return dirs, nil
}

// PrependPath is PATH with dirs before it, the last added first, as
// GitHub's runner prepends each add-path in turn.
func PrependPath(dirs []string, path string) string {
	parts := make([]string, 0, len(dirs)+1)
	for i := len(dirs) - 1; i >= 0; i-- {
		parts = append(parts, dirs[i])
	}
	if path != "" {
		parts = append(parts, path)
	}
	return strings.Join(parts, ":")
}

// ReadSummary reads the $GITHUB_STEP_SUMMARY file at path ("" when there
// is none): its first bounds.StepSummary bytes, with a note when it held
// more. It never fails the task, as GitHub's summary never fails a step:
// a file it cannot read is a note in its place.
func ReadSummary(path string) string {
	if path == "" {
		return ""
	}
	f, err := openAt(unix.AT_FDCWD, filepath.Clean(path), "$GITHUB_STEP_SUMMARY")
	if err != nil {
		return fmt.Sprintf("(the step summary was not read: %v)", err)
	}
	if f == nil {
		return ""
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, bounds.StepSummary+1))
	if err != nil {
		return fmt.Sprintf("(the step summary was not read: %v)", err)
	}
	if len(data) <= bounds.StepSummary {
		return strings.ToValidUTF8(string(data), "\uFFFD")
	}
	size := int64(len(data))
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	return strings.ToValidUTF8(bounds.Truncate(string(data), bounds.StepSummary), "\uFFFD") +
		fmt.Sprintf("\n\n(cut: the step summary is %d bytes; the first %d are kept)\n", size, bounds.StepSummary)
}
