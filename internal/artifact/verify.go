package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"

	"stoke.dev/stoke/internal/errdefs"
)

// verifier reads a blob and, at its end, checks its size and SHA-256
// against the manifest's: a blob changed or cut short in the backend ends
// the read with an error instead of EOF.
type verifier struct {
	rc     io.ReadCloser
	h      hash.Hash
	digest string
	size   int64
	n      int64
}

// Verify reads rc checking, at its end, that it was size bytes with
// SHA-256 digest ("sha256:<hex>"): a read that does not match ends with an
// error (Internal) instead of EOF. Clients check what a server sent.
func Verify(rc io.ReadCloser, digest string, size int64) io.ReadCloser {
	return newVerifier(rc, digest, size)
}

func newVerifier(rc io.ReadCloser, digest string, size int64) *verifier {
	return &verifier{rc: rc, h: sha256.New(), digest: digest, size: size}
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.size {
		return n, errdefs.Errorf(errdefs.ErrInternal, "artifact blob %s: longer than its %d bytes", v.digest, v.size)
	}
	if err == io.EOF {
		if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); v.n != v.size || got != v.digest {
			return n, errdefs.Errorf(errdefs.ErrInternal, "artifact blob %s: read %d bytes with digest %s: the stored blob is damaged", v.digest, v.n, got)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }

// hashingReader hashes and counts what is read through it, refusing past
// limit bytes: the backends' PutBlob.
type hashingReader struct {
	r     io.Reader
	h     hash.Hash
	n     int64
	limit int64
	// err is the first error the reader returned other than EOF: the
	// cause, when the SDK wraps it in its own words.
	err error
}

func newHashingReader(r io.Reader, limit int64) *hashingReader {
	return &hashingReader{r: r, h: sha256.New(), limit: limit}
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	if h.n += int64(n); h.n > h.limit {
		err = errdefs.Errorf(errdefs.ErrTooLarge, "the artifact is over %d bytes", h.limit)
	}
	if err != nil && err != io.EOF && h.err == nil {
		h.err = err
	}
	return n, err
}

// digest is "sha256:<hex>" of what was read.
func (h *hashingReader) digest() string { return "sha256:" + hex.EncodeToString(h.h.Sum(nil)) }
