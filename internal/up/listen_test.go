package up_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/syncbuf"
	"stoke.dev/stoke/internal/testtls"
	"stoke.dev/stoke/internal/up"
)

// Plain HTTP on an address that is not loopback would send the bearer
// token in clear text: refused at start unless the flag says the network
// is trusted, and then the log says so.
func TestPlainHTTPOffLoopbackNeedsTheTrustedNetworkFlag(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0"} {
		// Were it to start, it stops once it serves.
		ctx, cancel := context.WithCancel(t.Context())
		err := up.Run(ctx, up.Config{DataDir: privateDir(t), Listen: listen, DefaultRuntimes: []*v1alpha1.Runtime{},
			Ready: func(string) { cancel() }})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--"+up.InsecureListenFlag) || !strings.Contains(err.Error(), "--tls-cert") {
			t.Errorf("Run on %s = %v; want a refusal naming --%s and --tls-cert", listen, err, up.InsecureListenFlag)
		}
	}

	var log syncbuf.Buffer
	s := startUp(t, func(c *up.Config) {
		c.Listen, c.InsecureListenTrustedNetwork, c.DefaultRuntimes = "0.0.0.0:0", true, []*v1alpha1.Runtime{}
		c.Logger = slog.New(slog.NewJSONHandler(&log, nil))
	})
	if r := s.do(t, http.MethodGet, "/v1/runs", "", nil); r.status != http.StatusOK {
		t.Errorf("list with the flag: %s", r)
	}
	if !strings.Contains(log.String(), `"level":"WARN","msg":"serving plain HTTP on a non-loopback address`) {
		t.Errorf("the log does not say the token crosses the network in clear text:\n%s", log.String())
	}

	// HTTPS off loopback, and plain HTTP on loopback, need no flag.
	certFile, keyFile, _ := testtls.SelfSigned(t)
	startUp(t, func(c *up.Config) {
		c.Listen, c.TLSCert, c.TLSKey, c.DefaultRuntimes = "0.0.0.0:0", certFile, keyFile, []*v1alpha1.Runtime{}
	})
	startUp(t, func(c *up.Config) { c.Listen, c.DefaultRuntimes = "localhost:0", []*v1alpha1.Runtime{} })
}

// privateDir is a data directory stoke up accepts (mode 0700).
func privateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}
