package client

import (
	"errors"
	"fmt"
	"io/fs"

	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/errdefs"
)

// Environment variables a client command reads when its flag is not set.
const (
	EnvServer  = "STOKE_SERVER"
	EnvToken   = "STOKE_TOKEN"
	EnvDataDir = "STOKE_DATA_DIR"
	EnvCACert  = "STOKE_CA_CERT"
)

// Settings are a client command's flags; an empty field is unset.
type Settings struct {
	Server  string
	Token   string
	DataDir string
	CACert  string
}

// DataDir is the data directory of the local `stoke up` a client command
// means: flag, else STOKE_DATA_DIR, else datadir.Default().
func DataDir(flag string, getenv func(string) string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if dir := getenv(EnvDataDir); dir != "" {
		return dir, nil
	}
	return datadir.Default()
}

// Resolve decides where a client command connects and with which token:
// each setting comes from its flag, else its environment variable, else
// the default — the URL the running `stoke up` recorded in the data
// directory, else http://127.0.0.1:7070 (datadir.DefaultListen), and the
// token file of the data directory (--data-dir, else STOKE_DATA_DIR, else
// datadir.Default()) — so that on the machine running `stoke up` no flag
// is needed. getenv is os.Getenv outside tests.
func Resolve(s Settings, getenv func(string) string) (Config, error) {
	pick := func(flag, env, def string) string {
		if flag != "" {
			return flag
		}
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	// The data directory is only needed for what flags and environment
	// leave open: the server URL `stoke up` recorded, and the token.
	dataDir := func() (string, error) { return DataDir(s.DataDir, getenv) }
	cfg := Config{
		Server:     pick(s.Server, EnvServer, ""),
		Token:      pick(s.Token, EnvToken, ""),
		CACertFile: pick(s.CACert, EnvCACert, ""),
	}
	if cfg.Server == "" {
		cfg.Server = "http://" + datadir.DefaultListen
		if dir, err := dataDir(); err == nil {
			if u, err := datadir.ReadURL(dir); err == nil && u != "" {
				cfg.Server = u
			}
		}
	}
	if _, err := ParseServerURL(cfg.Server); err != nil {
		return Config{}, err
	}
	if cfg.Token != "" {
		return cfg, nil
	}
	dir, err := dataDir()
	if err != nil {
		return Config{}, fmt.Errorf("no API token: pass --token or set %s: %w", EnvToken, err)
	}
	tok, err := datadir.ReadToken(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Config{}, errdefs.Errorf(errdefs.ErrUnauthenticated,
			"no API token: pass --token, set %s, or start \"stoke up\", which writes %s", EnvToken, datadir.TokenPath(dir))
	case err != nil:
		return Config{}, errdefs.Errorf(errdefs.ErrUnauthenticated, "no API token: %v (pass --token or set %s)", err, EnvToken)
	}
	cfg.Token = tok
	return cfg, nil
}
