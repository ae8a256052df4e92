package invokefloor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"stoke.dev/stoke/internal/bounds"
)

// workerSource is the Python side of the pipe: one JSON line in on stdin,
// the handler's result as one JSON line out on stdout, as the actionloop
// launcher does it. argv[1] is the directory holding the handler module,
// argv[2] the module, whose handle(event) is called.
const workerSource = `import sys, json, importlib
sys.path.insert(0, sys.argv[1])
handle = importlib.import_module(sys.argv[2]).handle
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    line = inp.readline()
    if not line:
        break
    out.write(json.dumps(handle(json.loads(line)), ensure_ascii=False).encode("utf-8") + b"\n")
    out.flush()
`

// Worker is a persistent python3 process that answers one JSON line with
// one JSON line, one call at a time.
type Worker struct {
	mu  sync.Mutex
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// StartWorker starts python running module's handle from dir. The worker
// gets SIGKILL when the thread that started it ends, and leaves its
// stderr on this process's.
func StartWorker(python, dir, module string) (*Worker, error) {
	cmd := exec.Command(python, "-s", "-c", workerSource, dir, module)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", python, err)
	}
	// One more byte than the largest output, for its newline.
	return &Worker{cmd: cmd, in: in, out: bufio.NewReaderSize(out, bounds.InvokeBody+1)}, nil
}

// errNewline is the input the line framing cannot carry.
var errNewline = errors.New("input holds a newline, which the worker's line framing cannot carry")

// Call sends input, one JSON document without a newline, and returns the
// handler's result.
func (w *Worker) Call(input []byte) ([]byte, error) {
	if bytes.IndexByte(input, '\n') >= 0 {
		return nil, errNewline
	}
	line := make([]byte, len(input)+1)
	copy(line, input)
	line[len(input)] = '\n'
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.in.Write(line); err != nil {
		return nil, fmt.Errorf("writing to the worker: %w", err)
	}
	out, err := w.out.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("reading the worker's answer: %w", err)
	}
	return bytes.Clone(out[:len(out)-1]), nil
}

// Close kills the worker and waits for it.
func (w *Worker) Close() error {
	_ = w.cmd.Process.Kill()
	err := w.cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // killed, as asked
	}
	return err
}
