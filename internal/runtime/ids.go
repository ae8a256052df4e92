package runtime

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newID returns prefix followed by 26 lowercase base32 characters of
// randomness (128 bits): opaque, unguessable, safe in file names.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return prefix + strings.ToLower(idEncoding.EncodeToString(b[:]))
}
