// Package randid makes the opaque random IDs Stoke hands out (invocation,
// registration and scratch IDs): a prefix and 128 bits of randomness in
// lowercase base32, unguessable and safe in file names and URLs.
package randid

import (
	"crypto/rand"
	"encoding/base32"
)

// Len is how many characters New appends to its prefix.
const Len = 26

// encoding is base32 with a lowercase alphabet, so that an ID is made in
// one allocation: encoding, then lowering, then joining took four, on
// every invocation that brought no ID.
var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// New returns prefix followed by Len lowercase base32 characters of
// randomness (128 bits).
func New(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	var buf [64]byte
	if len(prefix)+Len > len(buf) {
		return prefix + encoding.EncodeToString(b[:])
	}
	n := copy(buf[:], prefix)
	encoding.Encode(buf[n:], b[:])
	return string(buf[:n+Len])
}
