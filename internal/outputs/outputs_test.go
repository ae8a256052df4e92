package outputs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr error
	}{
		{"empty", "", nil, nil},
		{"blank lines", "\n\n  \n", nil, nil},
		{"one", "A=1\n", map[string]string{"A": "1"}, nil},
		{"no final newline", "A=1\nB=two words", map[string]string{"A": "1", "B": "two words"}, nil},
		{"value with =", "URL=a=b=c\n", map[string]string{"URL": "a=b=c"}, nil},
		{"empty value", "A=\n", map[string]string{"A": ""}, nil},
		{"later wins", "A=1\nA=2\n", map[string]string{"A": "2"}, nil},
		{"crlf", "A=1\r\nB=2\r\n", map[string]string{"A": "1", "B": "2"}, nil},
		{"dots and dashes", "build.id-x=7\n", map[string]string{"build.id-x": "7"}, nil},
		{"no =", "JUSTAKEY\n", nil, errdefs.ErrInvalidArgument},
		{"empty key", "=v\n", nil, errdefs.ErrInvalidArgument},
		{"key starts with digit", "1A=v\n", nil, errdefs.ErrInvalidArgument},
		{"key with space", "A B=v\n", nil, errdefs.ErrInvalidArgument},
		{"invalid utf8 value", "A=\xff\n", nil, errdefs.ErrInvalidArgument},
		{"key at bound", strings.Repeat("k", bounds.OutputKey) + "=v", map[string]string{strings.Repeat("k", bounds.OutputKey): "v"}, nil},
		{"key past bound", strings.Repeat("k", bounds.OutputKey+1) + "=v", nil, errdefs.ErrTooLarge},
		{"value at bound", "A=" + strings.Repeat("v", bounds.OutputValue), map[string]string{"A": strings.Repeat("v", bounds.OutputValue)}, nil},
		{"value past bound", "A=" + strings.Repeat("v", bounds.OutputValue+1), nil, errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if !errors.Is(err, tt.wantErr) || (tt.wantErr != nil && err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Fatalf("got[%q] = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestValidateCounts(t *testing.T) {
	m := map[string]string{}
	for i := 0; i < bounds.OutputKeys; i++ {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	if err := Validate(m); err != nil {
		t.Fatalf("%d keys: %v", bounds.OutputKeys, err)
	}
	m["ONE_MORE"] = "v"
	if err := Validate(m); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("%d keys: %v, want too large", len(m), err)
	}
	// The total bound: eight values at the value bound are 64 KiB plus keys.
	big := map[string]string{}
	for i := 0; i < 8; i++ {
		big[fmt.Sprintf("K%d", i)] = strings.Repeat("v", bounds.OutputValue)
	}
	if err := Validate(big); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("over the total: %v", err)
	}
	delete(big, "K7")
	if err := Validate(big); err != nil {
		t.Fatalf("under the total: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	if got, err := ReadFile(filepath.Join(dir, "missing")); err != nil || got != nil {
		t.Fatalf("missing file: %v %v", got, err)
	}
	p := filepath.Join(dir, "out")
	if err := os.WriteFile(p, []byte("A=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFile(p); err != nil || got["A"] != "1" {
		t.Fatalf("ReadFile: %v %v", got, err)
	}
	// A huge file is refused without reading it all.
	if err := os.WriteFile(p, []byte(strings.Repeat("A=1\n", 1<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("huge file: %v", err)
	}
}

// TestReadFileAt checks what is not read: a symbolic link (it could point
// anywhere), a FIFO (the read would block) and a file with a second link.
func TestReadFileAt(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dirfd := int(d.Fd())
	if err := os.WriteFile(filepath.Join(dir, "out"), []byte("A=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFileAt(dirfd, "out"); err != nil || got["A"] != "1" {
		t.Fatalf("regular file: %v %v", got, err)
	}
	if got, err := ReadFileAt(dirfd, "missing"); err != nil || got != nil {
		t.Fatalf("missing file: %v %v", got, err)
	}
	if err := os.Symlink("out", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileAt(dirfd, "link"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("symbolic link: %v", err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileAt(dirfd, "fifo"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("FIFO: %v", err)
	}
	// A hard link could name a file the Run cannot read (the server's
	// token): the server, as root, would read it for the Run.
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("TOKEN=x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "secret"), filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileAt(dirfd, "hard"); err == nil || !strings.Contains(err.Error(), "more than one link") {
		t.Fatalf("hard link: %v", err)
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts is
// within every bound and valid UTF-8.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"A=1\n", "A=1\nB=2", "=x", "A=\xff", "K.v-1=a=b\r\n", "\n\n", strings.Repeat("A", 200) + "=1"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		if len(m) > bounds.OutputKeys {
			t.Fatalf("%d keys accepted", len(m))
		}
		for k, v := range m {
			if ValidateKey(k) != nil || len(v) > bounds.OutputValue || !utf8.ValidString(v) || strings.ContainsAny(v, "\n") {
				t.Fatalf("accepted %q=%q", k, v)
			}
		}
	})
}
