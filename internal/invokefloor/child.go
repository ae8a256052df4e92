package invokefloor

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// readyLine is what the back process writes once its socket listens.
const readyLine = "ready"

// startBack starts the back process (self's back subcommand) with
// GOMAXPROCS=procs, in this process's group, which the benchmark kills
// whole, and with SIGKILL when this process's starting thread ends; it
// returns once the back's socket listens.
func startBack(self string, cfg BackConfig, procs int) (*exec.Cmd, error) {
	cmd := exec.Command(self, "back", "-socket", cfg.Socket, "-python", cfg.Python,
		"-handler-dir", cfg.HandlerDir, "-module", cfg.Module)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("starting the back process: %w", err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) != readyLine {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the back process did not start: %q %v", line, err)
	}
	return cmd, nil
}
