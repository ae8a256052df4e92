package runlog

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
)

// Reader reads a Run's log in whole lines, picking up what is appended.
type Reader struct {
	path    string // "" for a name that cannot have a log
	f       *os.File
	partial []byte // a line whose end is not written yet
}

// Next returns the complete lines appended since the last call (each with
// its newline), at most about max bytes at a time, or nil when there are
// none yet.
func (r *Reader) Next(max int) ([]byte, error) {
	if r.f == nil {
		if r.path == "" {
			return nil, nil
		}
		f, err := os.Open(r.path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		r.f = f
	}
	buf := make([]byte, max)
	n, err := r.f.Read(buf)
	if n == 0 {
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return nil, nil
	}
	data := append(r.partial, buf[:n]...)
	i := bytes.LastIndexByte(data, '\n')
	if i < 0 {
		r.partial = data
		return nil, nil
	}
	r.partial = append([]byte(nil), data[i+1:]...)
	return data[:i+1], nil
}

// Close closes the reader.
func (r *Reader) Close() error {
	if r.f == nil {
		return nil
	}
	return r.f.Close()
}
