package server_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) {
	// A variable of the server's own environment that no handler may see.
	os.Setenv(runtimetest.ServerSecretEnv, "must-not-leak")
	goleak.VerifyTestMain(m)
}

func src(file, handler, text string) runtimetest.Source {
	if file == "" {
		return runtimetest.Source{Handler: handler}
	}
	return runtimetest.Source{Files: map[string]string{file: text}, Handler: handler}
}

var bashFixtures = map[runtimetest.Fixture]runtimetest.Source{
	runtimetest.Echo: src("handler.sh", "handler.handle", `handle() { printf '%s' "$1"; }`),
	runtimetest.Sleep: src("fn/sleep.sh", "fn/sleep.handle",
		`handle() { sleep "$(( $1 / 1000 )).$(printf '%03d' $(( $1 % 1000 )))"; printf true; }`),
	runtimetest.Fail:    src("handler.sh", "handler.handle", `handle() { echo "boom: it broke" >&2; return 3; }`),
	runtimetest.Outputs: src("handler.sh", "handler.handle", `handle() { printf 'greeting=hello\ncount=2\n' >> "$STOKE_OUTPUTS"; printf '"ok"'; }`),
	runtimetest.OutputValue: src("handler.sh", "handler.handle",
		`handle() { printf 'v=' > "$STOKE_OUTPUTS"; head -c "$1" /dev/zero | tr '\0' x >> "$STOKE_OUTPUTS"; printf '"ok"'; }`),
	runtimetest.BigOutput: src("handler.sh", "handler.handle",
		`handle() { printf '"'; head -c "$1" /dev/zero | tr '\0' x; printf '"'; }`),
	// printenv, not ${!name}: indirect expansion of request data could evaluate it.
	runtimetest.Env: src("handler.sh", "handler.handle", `handle() { local name=${1//\"/}; printf '"%s"' "$(printenv -- "$name")"; }`),
	runtimetest.Pwd: src("handler.sh", "handler.handle", `handle() { printf '"%s"' "$PWD"; }`),
	runtimetest.StderrFlood: src("handler.sh", "handler.handle",
		`handle() { head -c "$1" /dev/zero | tr '\0' e >&2; printf '"ok"'; }`),
	runtimetest.Exit:            src("handler.sh", "handler.handle", `handle() { [ "$1" != 1 ] || exit 7; printf '%s' "$1"; }`),
	runtimetest.SlowInit:        src("handler.sh", "handler.handle", "sleep 2\nhandle() { printf '%s' \"$1\"; }"),
	runtimetest.SyntaxError:     src("handler.sh", "handler.handle", `handle() { if; }`),
	runtimetest.MissingFunction: src("handler.sh", "handler.handle", `other() { :; }`),
	runtimetest.MissingFile:     src("", "nothere.handle", ""),
}

var pythonFixtures = map[runtimetest.Fixture]runtimetest.Source{
	runtimetest.Echo:  src("handler.py", "handler.handle", "def handle(event):\n    return event\n"),
	runtimetest.Sleep: src("fn/sleep.py", "fn.sleep.handle", "import time\n\ndef handle(ms):\n    time.sleep(ms / 1000)\n    return True\n"),
	runtimetest.Fail:  src("handler.py", "handler.handle", "def handle(event):\n    raise ValueError('boom: it broke')\n"),
	runtimetest.Outputs: src("handler.py", "handler.handle",
		"def handle(event, context):\n    context.set_output('greeting', 'hello')\n    context.set_output('count', '2')\n    return 'ok'\n"),
	runtimetest.OutputValue: src("handler.py", "handler.handle", "def handle(n, context):\n    context.set_output('v', 'x' * n)\n    return 'ok'\n"),
	runtimetest.BigOutput:   src("handler.py", "handler.handle", "def handle(n):\n    return 'x' * n\n"),
	runtimetest.Env:         src("handler.py", "handler.handle", "import os\n\ndef handle(name):\n    return os.environ.get(name, '')\n"),
	runtimetest.Pwd:         src("handler.py", "handler.handle", "import os\n\ndef handle(event):\n    return os.getcwd()\n"),
	runtimetest.StderrFlood: src("handler.py", "handler.handle",
		"import sys\n\ndef handle(n):\n    sys.stderr.write('e' * n)\n    sys.stderr.flush()\n    return 'ok'\n"),
	runtimetest.Exit:            src("handler.py", "handler.handle", "import os\n\ndef handle(event):\n    if event == 1:\n        os._exit(7)\n    return event\n"),
	runtimetest.SlowInit:        src("handler.py", "handler.handle", "import time\ntime.sleep(2)\n\ndef handle(event):\n    return event\n"),
	runtimetest.SyntaxError:     src("handler.py", "handler.handle", "def handle(event) return event\n"),
	runtimetest.MissingFunction: src("handler.py", "handler.handle", "def other(event):\n    return event\n"),
	runtimetest.MissingFile:     src("", "nothere.handle", ""),
}

func TestContractBash(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, runtimetest.Harness{
		Runtime:   "bash",
		Fixtures:  func(f runtimetest.Fixture) runtimetest.Source { return bashFixtures[f] },
		TaskOK:    src("ok.sh", "", "echo hello\necho RESULT=done >> \"$STOKE_OUTPUTS\"\n"),
		TaskSleep: src("sleep.sh", "", "sleep 60\n"),
	})
}

func TestContractPython(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, runtimetest.Harness{
		Runtime:   "python",
		Fixtures:  func(f runtimetest.Fixture) runtimetest.Source { return pythonFixtures[f] },
		TaskOK:    src("ok.py", "", "import os\nprint('hello')\nwith open(os.environ['STOKE_OUTPUTS'], 'a') as f:\n    f.write('RESULT=done\\n')\n"),
		TaskSleep: src("sleep.py", "", "import time\ntime.sleep(60)\n"),
	})
}
