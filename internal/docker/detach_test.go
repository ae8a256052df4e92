package docker

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"stoke.dev/stoke/internal/errdefs"
)

func TestParseDetachKeys(t *testing.T) {
	for spec, want := range map[string][]byte{"": {16, 17}, "ctrl-x,x": {24, 'x'}, "ctrl-@,ctrl-_": {0, 31}} {
		got, err := parseDetachKeys(spec)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("parseDetachKeys(%q) = %v, %v; want %v", spec, got, err, want)
		}
	}
	for _, spec := range []string{"ctrl-", "ctrl-p,,", "ab", "ctrl-pp"} {
		if _, err := parseDetachKeys(spec); errdefs.HTTPStatus(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "Invalid detach keys") {
			t.Errorf("parseDetachKeys(%q): %v, want a 400", spec, err)
		}
	}
}

// One byte a read, so that the held ^P is a partial match across reads.
func TestDetachingStdin(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a\x10b\x10\x11z", "a\x10b"}, // the keys end it; what follows is not read
		{"a\x10", "a"},                // EOF: a held partial match is dropped, as moby's proxy
		{"abc", "abc"},
	} {
		detached := 0
		r := newDetachingStdin(iotest.OneByteReader(strings.NewReader(tc.in)), defaultDetachKeys, func() { detached++ })
		got, err := io.ReadAll(r)
		if string(got) != tc.want || !errors.Is(err, errDetached) || detached != 1 {
			t.Errorf("%q: read %q, %v, detached %d times; want %q, errDetached, once", tc.in, got, err, detached, tc.want)
		}
		if _, err := r.Read(make([]byte, 8)); !errors.Is(err, errDetached) || detached != 1 {
			t.Errorf("%q: a read after the detach: %v, detached %d times", tc.in, err, detached)
		}
	}
}
