package gitsource

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Credentials give the Authorization header value for a repository URL,
// or "" for none.
type Credentials interface {
	For(url string) Auth
}

// FileCredentials are credentials read from a file in the format of git's
// credential store (git-credential-store(1)): one URL with user and
// password per line, https://USER:PASSWORD@HOST[/PATH]. A repository URL
// takes the first line whose scheme and host are its own and whose path,
// if any, is a prefix of its path; they are sent as HTTP Basic
// authentication.
type FileCredentials struct {
	entries []credential
}

type credential struct {
	scheme, host, path string
	auth               Auth
}

// ReadCredentialsFile reads path. Errors name the line, never its content.
func ReadCredentialsFile(path string) (*FileCredentials, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("git credentials: %w", err)
	}
	fc := &FileCredentials{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		u, err := url.Parse(line)
		if err != nil || u.User == nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("git credentials %s line %d: want https://USER:PASSWORD@HOST[/PATH]", path, n)
		}
		pw, _ := u.User.Password()
		token := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pw))
		fc.entries = append(fc.entries, credential{scheme: u.Scheme, host: u.Host, path: strings.TrimSuffix(u.Path, "/"), auth: Auth("Basic " + token)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("git credentials %s: %w", path, err)
	}
	return fc, nil
}

// For implements Credentials.
func (fc *FileCredentials) For(raw string) Auth {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	for _, c := range fc.entries {
		if c.scheme == u.Scheme && c.host == u.Host && (c.path == "" || u.Path == c.path || strings.HasPrefix(u.Path, c.path+"/")) {
			return c.auth
		}
	}
	return ""
}

// CredentialsFile is a credentials file (ReadCredentialsFile's format)
// read again when it changes: a Kubernetes Secret volume's file, which
// the kubelet replaces when the Secret changes. A reading that fails
// keeps the last good one, so that a file being replaced never leaves a
// fetch with no credentials.
type CredentialsFile struct {
	path string

	mu    sync.Mutex
	stamp fileStamp
	fc    *FileCredentials
}

type fileStamp struct {
	mtime time.Time
	size  int64
	ino   uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	s := fileStamp{mtime: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// OpenCredentialsFile reads path now, failing if it cannot.
func OpenCredentialsFile(path string) (*CredentialsFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("git credentials: %w", err)
	}
	fc, err := ReadCredentialsFile(path)
	if err != nil {
		return nil, err
	}
	return &CredentialsFile{path: path, stamp: stampOf(fi), fc: fc}, nil
}

// For implements Credentials, reading the file again first if it changed.
func (c *CredentialsFile) For(raw string) Auth {
	c.mu.Lock()
	defer c.mu.Unlock()
	if fi, err := os.Stat(c.path); err == nil && stampOf(fi) != c.stamp {
		if fc, err := ReadCredentialsFile(c.path); err == nil {
			c.fc, c.stamp = fc, stampOf(fi)
		}
	}
	return c.fc.For(raw)
}
