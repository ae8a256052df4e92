package gitsource

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strings"
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
