package outputs

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

func TestParseGitHub(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]string
		err      string // a part of the error; "" means none
	}{
		{"empty", "", nil, ""},
		{"pairs", "a=1\nb=two words\n", map[string]string{"a": "1", "b": "two words"}, ""},
		{"last line without newline", "a=1\nb=2", map[string]string{"a": "1", "b": "2"}, ""},
		{"value with = and <<", "a=x=y<<z\n", map[string]string{"a": "x=y<<z"}, ""},
		{"empty value", "a=\n", map[string]string{"a": ""}, ""},
		{"later wins", "a=1\na=2\n", map[string]string{"a": "2"}, ""},
		{"blank lines", "\n\na=1\n\n", map[string]string{"a": "1"}, ""},
		{"heredoc", "text<<EOF\nline 1\n\nline 3\nEOF\nnext=x\n", map[string]string{"text": "line 1\n\nline 3", "next": "x"}, ""},
		{"heredoc GitHub's delimiter", "j<<ghadelimiter_1b9a7c3e\n{\"a\": 1}\nghadelimiter_1b9a7c3e\n", map[string]string{"j": `{"a": 1}`}, ""},
		{"heredoc empty", "e<<EOF\nEOF\n", map[string]string{"e": ""}, ""},
		{"heredoc before =", "h<<A=B\nv\nA=B\n", map[string]string{"h": "v"}, ""},
		{"heredoc holds a pair", "h<<EOF\nx=1\nEOF\n", map[string]string{"h": "x=1"}, ""},
		{"heredoc delimiter must be the whole line", "h<<EOF\n EOF\nEOF \nEOF\n", map[string]string{"h": " EOF\nEOF "}, ""},
		{"CRLF", "a=1\r\nh<<EOF\r\nx\r\ny\r\nEOF\r\n", map[string]string{"a": "1", "h": "x\ny"}, ""},
		{"missing delimiter", "a=1\nh<<EOF\nx\n", nil, `line 2: the delimiter "EOF" of "h" never comes`},
		{"no delimiter", "h<<\nx\n", nil, "line 1: want NAME<<DELIMITER"},
		{"no name", "=1\n", nil, "line 1: empty name"},
		{"no name heredoc", "<<EOF\nx\nEOF\n", nil, "line 1: want NAME<<DELIMITER"},
		{"neither", "a=1\njust text\n", nil, "line 2: want NAME=VALUE or NAME<<DELIMITER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseGitHub([]byte(tc.in), "$GITHUB_OUTPUT")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "$GITHUB_OUTPUT") {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("error %v is not InvalidArgument", err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestGitHubBounds(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if m, err := ReadGitHubFile(filepath.Join(dir, "missing"), "$GITHUB_ENV"); m != nil || err != nil {
		t.Fatalf("a missing file: %v, %v", m, err)
	}
	// Over the file bound: refused before parsing.
	big := write("big", "a="+strings.Repeat("x", maxGitHubFile)+"\n")
	if _, err := ReadGitHubFile(big, "$GITHUB_OUTPUT"); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a file over its bound: %v", err)
	}
	if err := os.Symlink(big, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadGitHubFile(filepath.Join(dir, "link"), "$GITHUB_OUTPUT"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a link: %v", err)
	}
	// Within the file bound, a value over the outputs bound.
	m, err := ReadGitHubFile(write("value", "h<<EOF\n"+strings.Repeat("v", bounds.OutputValue+1)+"\nEOF\n"), "$GITHUB_OUTPUT")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Merge(map[string]string{"s": "1"}, m); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a value over its bound merged: %v", err)
	}
	if err := ValidateEnv(m); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("an env value over its bound: %v", err)
	}
	for _, bad := range []map[string]string{{"1X": "v"}, {"A-B": "v"}, {"A": "a\x00b"}} {
		if err := ValidateEnv(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateEnv(%q) = %v", bad, err)
		}
	}
	got, err := Merge(map[string]string{"a": "stoke", "b": "stoke"}, map[string]string{"b": "github"})
	if err != nil || !maps.Equal(got, map[string]string{"a": "stoke", "b": "github"}) {
		t.Errorf("Merge = %v, %v", got, err)
	}
}
