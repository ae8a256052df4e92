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

// Resolve decides where a client command connects and with which token:
// each setting comes from its flag, else its environment variable, else
// the default — http://127.0.0.1:7070 (datadir.DefaultListen) and the
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
	cfg := Config{
		Server:     pick(s.Server, EnvServer, "http://"+datadir.DefaultListen),
		Token:      pick(s.Token, EnvToken, ""),
		CACertFile: pick(s.CACert, EnvCACert, ""),
	}
	if _, err := ParseServerURL(cfg.Server); err != nil {
		return Config{}, err
	}
	if cfg.Token != "" {
		return cfg, nil
	}
	dir := pick(s.DataDir, EnvDataDir, "")
	if dir == "" {
		d, err := datadir.Default()
		if err != nil {
			return Config{}, fmt.Errorf("no API token: pass --token or set %s: %w", EnvToken, err)
		}
		dir = d
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
