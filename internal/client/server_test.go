package client_test

import (
	"fmt"
	"os"
	"testing"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/testbin"
)

// stokeBin is the stoke binary, built once; shared is a `stoke up` every
// test may use.
var (
	stokeBin string
	shared   *server
)

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	dir, err := os.MkdirTemp("", "stoke-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = startServer(dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	cleanup()
	os.Exit(code)
}

// server is a `stoke up` child process the tests talk to.
type server struct {
	*testbin.Up
}

// startServer runs `stoke up` on a free loopback port with its data in
// dataDir; the caller stops it.
func startServer(dataDir string, extra ...string) (*server, error) {
	u, err := testbin.StartUp(stokeBin, dataDir, extra...)
	if err != nil {
		return nil, err
	}
	return &server{Up: u}, nil
}

// newClient returns a client of s.
func (s *server) newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Server: s.URL, Token: s.Token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
