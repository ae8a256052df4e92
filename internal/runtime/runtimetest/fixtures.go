package runtimetest

// The fixtures of the built-in runtimes, for every Runtime Server that runs
// Bash or Python code: the local one and the lambda one.

func src(file, handler, text string) Source {
	if file == "" {
		return Source{Handler: handler}
	}
	return Source{Files: map[string]string{file: text}, Handler: handler}
}

var bashFixtures = map[Fixture]Source{
	Echo: src("handler.sh", "handler.handle", `handle() { printf '%s' "$1"; }`),
	Sleep: src("fn/sleep.sh", "fn/sleep.handle",
		`handle() { sleep "$(( $1 / 1000 )).$(printf '%03d' $(( $1 % 1000 )))"; printf true; }`),
	Fail:    src("handler.sh", "handler.handle", `handle() { echo "boom: it broke" >&2; return 3; }`),
	Outputs: src("handler.sh", "handler.handle", `handle() { printf 'greeting=hello\ncount=2\n' >> "$STOKE_OUTPUTS"; printf '"ok"'; }`),
	OutputValue: src("handler.sh", "handler.handle",
		`handle() { printf 'v=' > "$STOKE_OUTPUTS"; head -c "$1" /dev/zero | tr '\0' x >> "$STOKE_OUTPUTS"; printf '"ok"'; }`),
	BigOutput: src("handler.sh", "handler.handle",
		`handle() { printf '"'; head -c "$1" /dev/zero | tr '\0' x; printf '"'; }`),
	// printenv, not ${!name}: indirect expansion of request data could evaluate it.
	Env: src("handler.sh", "handler.handle", `handle() { local name=${1//\"/}; printf '"%s"' "$(printenv -- "$name")"; }`),
	Pwd: src("handler.sh", "handler.handle", `handle() { printf '"%s"' "$PWD"; }`),
	StderrFlood: src("handler.sh", "handler.handle",
		`handle() { head -c "$1" /dev/zero | tr '\0' e >&2; printf '"ok"'; }`),
	Exit:            src("handler.sh", "handler.handle", `handle() { [ "$1" != 1 ] || exit 7; printf '%s' "$1"; }`),
	SlowInit:        src("handler.sh", "handler.handle", "read -r _ < \"$STOKE_GATE\"\nhandle() { printf '%s' \"$1\"; }"),
	SyntaxError:     src("handler.sh", "handler.handle", `handle() { if; }`),
	MissingFunction: src("handler.sh", "handler.handle", `other() { :; }`),
	MissingFile:     src("", "nothere.handle", ""),
}

var pythonFixtures = map[Fixture]Source{
	Echo:  src("handler.py", "handler.handle", "def handle(event):\n    return event\n"),
	Sleep: src("fn/sleep.py", "fn.sleep.handle", "import time\n\ndef handle(ms):\n    time.sleep(ms / 1000)\n    return True\n"),
	Fail:  src("handler.py", "handler.handle", "def handle(event):\n    raise ValueError('boom: it broke')\n"),
	Outputs: src("handler.py", "handler.handle",
		"def handle(event, context):\n    context.set_output('greeting', 'hello')\n    context.set_output('count', '2')\n    return 'ok'\n"),
	OutputValue: src("handler.py", "handler.handle", "def handle(n, context):\n    context.set_output('v', 'x' * n)\n    return 'ok'\n"),
	BigOutput:   src("handler.py", "handler.handle", "def handle(n):\n    return 'x' * n\n"),
	Env:         src("handler.py", "handler.handle", "import os\n\ndef handle(name):\n    return os.environ.get(name, '')\n"),
	Pwd:         src("handler.py", "handler.handle", "import os\n\ndef handle(event):\n    return os.getcwd()\n"),
	StderrFlood: src("handler.py", "handler.handle",
		"import sys\n\ndef handle(n):\n    sys.stderr.write('e' * n)\n    sys.stderr.flush()\n    return 'ok'\n"),
	Exit: src("handler.py", "handler.handle", "import os\n\ndef handle(event):\n    if event == 1:\n        os._exit(7)\n    return event\n"),
	SlowInit: src("handler.py", "handler.handle",
		"import os\nfd = os.open(os.environ['STOKE_GATE'], os.O_RDONLY)\nos.read(fd, 1)\nos.close(fd)\n\ndef handle(event):\n    return event\n"),
	SyntaxError:     src("handler.py", "handler.handle", "def handle(event) return event\n"),
	MissingFunction: src("handler.py", "handler.handle", "def other(event):\n    return event\n"),
	MissingFile:     src("", "nothere.handle", ""),
}

// Bash is the harness of Bash code on the runtime named runtime.
func Bash(runtime string) Harness {
	return Harness{
		Runtime:   runtime,
		Fixtures:  func(f Fixture) Source { return bashFixtures[f] },
		TaskOK:    src("ok.sh", "", "echo hello\necho RESULT=done >> \"$STOKE_OUTPUTS\"\n"),
		TaskSleep: src("sleep.sh", "", "sleep 60\n"),
	}
}

// Python is the harness of Python code on the runtime named runtime.
func Python(runtime string) Harness {
	return Harness{
		Runtime:   runtime,
		Fixtures:  func(f Fixture) Source { return pythonFixtures[f] },
		TaskOK:    src("ok.py", "", "import os\nprint('hello')\nwith open(os.environ['STOKE_OUTPUTS'], 'a') as f:\n    f.write('RESULT=done\\n')\n"),
		TaskSleep: src("sleep.py", "", "import time\ntime.sleep(60)\n"),
	}
}
