package client_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
		if err := shared.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stoke up:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	cleanup()
	os.Exit(code)
}

// server is a real `stoke up` child process.
type server struct {
	url, token, dataDir string
	cmd                 *exec.Cmd
	exited              chan error
}

// startServer runs `stoke up` on a free loopback port and waits for its
// "serving" log line.
func startServer(dataDir string, extra ...string) (*server, error) {
	cmd := exec.Command(stokeBin, append([]string{"up", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, extra...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{dataDir: dataDir, cmd: cmd, exited: make(chan error, 1)}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg string `json:"msg"`
				URL string `json:"url"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				urlc <- line.URL
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.exited <- cmd.Wait()
	}()
	select {
	case s.url = <-urlc:
	case err := <-s.exited:
		return nil, fmt.Errorf("stoke up exited before serving: %v", err)
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("stoke up did not log its URL")
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, "token"))
	if err != nil {
		_ = s.stop()
		return nil, err
	}
	s.token = strings.TrimSpace(string(tok))
	return s, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop() error {
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-s.exited:
		return err
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		return fmt.Errorf("stoke up did not stop after SIGTERM")
	}
}

// newClient returns a client of s.
func (s *server) newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Server: s.url, Token: s.token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
