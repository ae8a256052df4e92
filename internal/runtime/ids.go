package runtime

import (
	"crypto/rand"
	"encoding/base32"
)

// idEncoding is base32 with a lowercase alphabet, so that an ID is made
// in one allocation (an invocation without an ID gets one on every call).
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix followed by 26 lowercase base32 characters of
// randomness (128 bits): opaque, unguessable, safe in file names.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	var buf [64]byte
	if len(prefix)+26 > len(buf) {
		return prefix + idEncoding.EncodeToString(b[:])
	}
	n := copy(buf[:], prefix)
	idEncoding.Encode(buf[n:], b[:])
	return string(buf[:n+26])
}
