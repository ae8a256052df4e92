# Stoke's warm Python worker, embedded in internal/runtime/python and run as
#
#   python3 -s -c <this program> HANDLER \
#       MAX_OUTPUT MAX_OUTPUT_KEYS MAX_OUTPUTS_TOTAL MAX_MESSAGE MAX_STACK
#
# with the working directory and the Run UID in the environment variables
# __STOKE_WORKDIR and __STOKE_RUN_UID, which it removes before the handler
# loads: every user can read a process's arguments, only its owner its
# environment, and the Run UID (which the working directory's path holds)
# must not be shown to other users. A spare (HANDLER "") is started ahead
# and handed all three, with the registration's environment and its
# requirements directory, on fd 3 once its registration comes (spare.go).
#
# It imports the handler's module once, resolves the function, reports READY
# (or INIT_ERROR) and then serves one invocation at a time over two inherited
# pipes: requests arrive on fd 3, responses leave on fd 4. stdout and stderr
# belong to the handler and are logged by the Go side; nothing of the
# protocol ever goes through them. The framing is described in the package
# documentation (python.go); the constants below must match it.
#
# Start-up cost and idle memory are paid once per registration, so this
# program imports only what every worker needs: no json package (it drags in
# re and enum), no inspect, no asyncio (only for async handlers), no
# traceback (only once something raised).
import os
import sys
from struct import Struct
from time import monotonic

REQ_FD = 3
RESP_FD = 4

# Response kinds.
OK = 1
ERROR = 2
READY = 3
INIT_ERROR = 4
HANDED = 5  # a spare's: it has taken its registration
SPARE = 6  # a spare's: started, waiting for its registration
REFUSED = 7  # a spare's: it cannot take that registration, and waits on

# A spare is started with this entry leading PYTHONPATH, where a
# registration's requirements directory would have been on its own
# interpreter's: the handover puts the directory in its place, or drops it.
# It cannot exist (/dev/null is no directory), so no import finds anything
# there. spare.go's depsMark is the same.
DEPS_MARK = '/dev/null/stoke-requirements'

_REQ = Struct('<IIIQ')  # id length, scope length, input length, remaining ns
_RESP = Struct('<IB')  # payload length, kind
_U32 = Struct('<I')
_KV = Struct('<II')

_CO_VARARGS = 0x04
_CO_COROUTINE = 0x80 | 0x100  # CO_COROUTINE | CO_ITERABLE_COROUTINE
_MAX_TYPE = 256


async def _probe():
    pass


_c = _probe()
_Coroutine = type(_c)
_c.close()
del _c
_Code = type(_probe.__code__)


def _json_codec():
    """Returns (loads, dumps) for compact, strict JSON.

    The C accelerator that the json package itself uses is driven directly,
    which spares every worker the import of json (and re, enum, ...). Its
    interface is private, so it is checked once and the json package is the
    fallback.
    """
    try:
        from _json import (encode_basestring, encode_basestring_ascii,
                           make_encoder, make_scanner)

        def default(o):
            raise TypeError(f'Object of type {type(o).__name__} '
                            'is not JSON serializable')

        class _Ctx:
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = {'-Infinity': float('-inf'),
                              'Infinity': float('inf'),
                              'NaN': float('nan')}.__getitem__

        scan = make_scanner(_Ctx)
        # The C encoder tracks containers in progress in markers to detect
        # cycles; an error can leave entries behind, so it is cleared per call.
        markers = {}
        enc = make_encoder(markers, default, encode_basestring, None,
                           ':', ',', False, False, False)
        enc_ascii = make_encoder(markers, default, encode_basestring_ascii,
                                 None, ':', ',', False, False, False)

        def loads(data):
            s = data.decode('utf-8').strip(' \t\n\r')
            try:
                obj, end = scan(s, 0)
            except StopIteration:
                raise ValueError('input is not a JSON value') from None
            if end != len(s):
                raise ValueError(f'extra data after the JSON value at {end}')
            return obj

        def dumps(obj):
            markers.clear()
            text = ''.join(enc(obj, 0))
            try:
                return text.encode('utf-8')
            except UnicodeEncodeError:
                # Lone surrogates: escape everything instead.
                markers.clear()
                return ''.join(enc_ascii(obj, 0)).encode('ascii')

        sample = {'a': [1, 2.5, None, True, 'é\n'], 'b': {}}
        if (dumps(sample) != '{"a":[1,2.5,null,true,"é\\n"],"b":{}}'.encode()
                or loads(b' {"a":[1,2.5,null,true,"\\u00e9\\n"],"b":{}} ')
                != sample):
            raise ValueError('unexpected _json behaviour')
        return loads, dumps
    except Exception:
        import json
        encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False,
                                   separators=(',', ':'))
        encoder_ascii = json.JSONEncoder(allow_nan=False,
                                         separators=(',', ':'))

        def dumps(obj):
            try:
                return encoder.encode(obj).encode('utf-8')
            except UnicodeEncodeError:
                return encoder_ascii.encode(obj).encode('ascii')

        return json.loads, dumps


class Context:
    """The second argument of a handler that accepts two."""

    __slots__ = ('invocation_id', 'run_uid', '_deadline', '_outputs')

    def __init__(self, invocation_id, run_uid, deadline):
        self.invocation_id = invocation_id
        self.run_uid = run_uid
        self._deadline = deadline
        self._outputs = None

    def get_remaining_time_in_millis(self):
        ms = int((self._deadline - monotonic()) * 1000)
        return ms if ms > 0 else 0

    def set_output(self, key, value):
        """Sets one output of this invocation; a later value replaces an
        earlier one. Keys and values are strings; their bounds are checked
        when the invocation returns."""
        if not isinstance(key, str):
            raise TypeError(f'output key must be str, not {type(key).__name__}')
        if not isinstance(value, str):
            raise TypeError(f'output value must be str, not {type(value).__name__}')
        # Encode now so that a string that is not valid UTF-8 fails here,
        # in the handler's own frame.
        kb, vb = key.encode('utf-8'), value.encode('utf-8')
        if self._outputs is None:
            self._outputs = {}
        self._outputs[key] = (kb, vb)

    def __repr__(self):
        return (f'Context(invocation_id={self.invocation_id!r}, '
                f'run_uid={self.run_uid!r})')


def _send(kind, payload=b''):
    data = memoryview(_RESP.pack(len(payload), kind) + payload)
    while data:
        data = data[os.write(RESP_FD, data):]


def _string(s, limit, keep_end=False):
    s = s[-limit:] if keep_end else s[:limit]
    b = s.encode('utf-8', 'backslashreplace')
    return _U32.pack(len(b)) + b


def _error_payload(type_name, message, stack, limits):
    return (_string(type_name, _MAX_TYPE) + _string(message, limits[3])
            + _string(stack, limits[4], keep_end=True))


def _exception_payload(exc, tb, limits):
    """Describes exc with the traceback tb (the worker's own frames already
    skipped): module-qualified class name unless builtin, str(exc), and the
    formatted traceback."""
    cls = type(exc)
    name = getattr(cls, '__qualname__', cls.__name__)
    module = getattr(cls, '__module__', None)
    if module and module != 'builtins':
        name = f'{module}.{name}'
    try:
        message = str(exc)
    except Exception:
        message = f'<str() of {name} failed>'
    try:
        import traceback
        stack = ''.join(traceback.format_exception(cls, exc, tb))
    except Exception:
        stack = ''
    return _error_payload(name, message, stack, limits)


def _flush():
    # The handler's output must be in its pipes before the response, so that
    # the Go side logs it under this invocation.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _exit(code):
    """Honours sys.exit() from a handler: the worker really exits (the Go
    side reports Runtime.ExitError and starts a replacement)."""
    _flush()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr, flush=True)
        code = 1
    os._exit(code & 0xff)


def _shape(fn):
    """Returns (takes_context, is_async) from the handler's signature, read
    from its code object where possible so that inspect is not imported."""
    is_async = bool(getattr(getattr(fn, '__code__', None), 'co_flags', 0)
                    & _CO_COROUTINE)
    target = fn
    for _ in range(100):  # decorators made with functools.wraps
        wrapped = getattr(target, '__wrapped__', None)
        if wrapped is None:
            break
        target = wrapped
    code = getattr(target, '__code__', None)
    if isinstance(code, _Code):
        if code.co_flags & _CO_VARARGS:
            return True, is_async
        n = code.co_argcount
        if getattr(target, '__self__', None) is not None:
            n -= 1  # a bound method: self is already supplied
    else:
        import inspect  # rare: a callable object, a partial, a builtin
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return False, is_async
        n = 0
        for p in params:
            if p.kind == p.VAR_POSITIONAL:
                return True, is_async
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                n += 1
    if n < 1:
        raise TypeError('the handler takes no positional argument; it must '
                        'accept (event) or (event, context)')
    return n >= 2, is_async


_loop = None


def _event_loop():
    """One event loop per worker, reused by every invocation of an async
    handler (asyncio.run would build and tear down a loop per call)."""
    global _loop
    if _loop is None or _loop.is_closed():
        import asyncio
        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    return _loop


async def _guard(coro):
    # Catching here keeps asyncio's frames out of the traceback: it starts
    # at this frame, which the caller skips.
    try:
        return True, await coro
    except Exception as exc:
        return False, exc


def _read_request():
    """Returns (invocation id, input bytes, remaining ns), or None at EOF."""
    buf = os.read(REQ_FD, 65536)
    if not buf:
        return None
    while len(buf) < _REQ.size:
        more = os.read(REQ_FD, 65536)
        if not more:
            raise EOFError('request pipe closed inside a frame')
        buf += more
    id_len, scope_len, input_len, remaining = _REQ.unpack_from(buf)
    total = _REQ.size + id_len + scope_len + input_len
    if len(buf) < total:
        parts, have = [buf], len(buf)
        while have < total:
            more = os.read(REQ_FD, total - have)
            if not more:
                raise EOFError('request pipe closed inside a frame')
            parts.append(more)
            have += len(more)
        buf = b''.join(parts)
    elif len(buf) > total:
        raise ValueError('request frame followed by unexpected bytes')
    start = _REQ.size + id_len
    end = start + scope_len
    return (buf[_REQ.size:start].decode(), buf[start:end].decode(),
            buf[end:total], remaining)


def _from_source(workdir, module_name):
    """Raises ImportError unless module_name and every package above it
    are imported from files under workdir (the Run's source): a module of
    the standard library or of site-packages, or one the interpreter holds
    already, is no handler (handler: os.system would run its input as a
    shell command). Each level's spec is found as the import system finds
    it (sys.meta_path in order) and checked before anything of it runs; a
    package above the module is imported once checked (it is the source's
    own code, which the module's import would run anyway); a namespace
    package has no code and passes on to its contents."""
    root = os.path.join(os.path.realpath(workdir), '')
    parts = module_name.split('.')
    path = None
    for i in range(len(parts)):
        name = '.'.join(parts[:i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None and i == 0:
            raise ImportError(f'module {name!r} is not from the Run\'s source: '
                              'the interpreter has loaded it already; a '
                              'handler\'s module must be a file of the source',
                              name=name)
        spec = getattr(loaded, '__spec__', None)
        if loaded is None:
            for finder in sys.meta_path:
                find = getattr(finder, 'find_spec', None)
                if find is not None:
                    spec = find(name, path)
                    if spec is not None:
                        break
            if spec is None:
                raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        where = getattr(spec, 'origin', None)
        if getattr(spec, 'has_location', False):
            ok = os.path.realpath(where).startswith(root)
        else:
            # Built in, frozen, or a namespace package (no origin, only
            # portions: its contents are checked in turn).
            ok = spec is not None and where is None and \
                spec.submodule_search_locations is not None
        if not ok:
            raise ImportError(f'module {name!r} is not from the Run\'s source: '
                              f'it is {where or "built in"}; a handler\'s '
                              'module must be a file of the source', name=name)
        if i + 1 < len(parts):
            __import__(name)
            path = getattr(sys.modules[name], '__path__', None)
            if path is None:
                raise ModuleNotFoundError(
                    f'No module named {parts[i + 1]!r} in {name!r}: '
                    f'{name!r} is not a package', name=name)


def _read_exact(n):
    parts, have = [], 0
    while have < n:
        more = os.read(REQ_FD, n - have)
        if not more:
            os._exit(0)  # the Go side closed the pipe: no registration came
        parts.append(more)
        have += len(more)
    return b''.join(parts)


def _shadowed(deps):
    """Why the requirements directory deps cannot be put on this spare's
    sys.path as PYTHONPATH would have put it on its own interpreter's, or
    None. An interpreter with deps on PYTHONPATH looks there first for
    every import of its start-up too: a top-level module of deps whose name
    this one has imported (sys.modules: the worker's imports, `site`'s, its
    .pth files') came from elsewhere here, but would have come from deps;
    and `site` imports sitecustomize (and usercustomize, off under -s) from
    the whole path, deps included. Each entry is taken as the module or
    package it could be, by its name up to the first dot (a directory by its
    whole name): more than the import system finds, never less. Its .pth
    files are not looked at: `site` reads them in site directories alone,
    never on PYTHONPATH, so neither does this."""
    if DEPS_MARK not in sys.path:
        return 'its sys.path has no place for the requirements'
    loaded = {name.partition('.')[0] for name in list(sys.modules)}
    try:
        with os.scandir(deps) as entries:
            for e in entries:
                name = e.name if e.is_dir() else e.name.partition('.')[0]
                if name in ('sitecustomize', 'usercustomize'):
                    return (f'the requirements hold {name}, which an '
                            'interpreter imports at its start')
                if name in loaded:
                    return (f'the requirements\' {e.name} would shadow the '
                            f'module {name!r} the spare has imported')
    except OSError as e:
        return f'cannot list the requirements directory: {e}'
    return None


def _handover():
    """A spare's: waits for its registration (the frame is described in
    spare.go), acknowledges it, and takes its environment, working
    directory and requirements; returns (workdir, run_uid, handler). A
    registration whose requirements it cannot take as its own interpreter
    would have (_shadowed) is refused (REFUSED, why), nothing of it taken,
    and it waits for the next."""
    while True:
        n, = _U32.unpack(_read_exact(4))
        data = _read_exact(n)
        fields, off = [], 0
        while off < n:
            k, = _U32.unpack_from(data, off)
            off += 4
            fields.append(os.fsdecode(data[off:off + k]))
            off += k
        deps = fields[3]
        why = _shadowed(deps) if deps else None
        if why is None:
            break
        _send(REFUSED, why[:1024].encode('utf-8', 'backslashreplace'))
    _send(HANDED)
    workdir, run_uid, handler = fields[0], fields[1], fields[2]
    count = int(fields[4])
    started = dict(kv.partition('=')[::2] for kv in fields[5:5 + count])
    # What `site` (a .pth file) changed in the environment it was started
    # with is kept, as a fresh worker's `site` would have done it in the
    # registration's: the variables it reads are the same.
    environ = os.environ
    changed = {k: v for k, v in environ.items() if started.get(k) != v}
    removed = [k for k in started if k not in environ]
    environ.clear()
    for kv in fields[5 + count:]:
        k, _, v = kv.partition('=')
        environ[k] = v
    environ.update(changed)
    for k in removed:
        environ.pop(k, None)
    # The requirements directory where PYTHONPATH would have put it, or
    # nothing: the mark is the spare's alone.
    path = sys.path
    while DEPS_MARK in path:
        i = path.index(DEPS_MARK)
        path[i:i + 1] = [deps] if deps else []
        deps = ''
    sys.path_importer_cache.pop(DEPS_MARK, None)
    os.chdir(workdir)
    return workdir, run_uid, handler


def _load(workdir, handler, limits):
    """Imports the handler; returns (function, takes_context) or exits after
    reporting INIT_ERROR."""
    sys.argv[:] = ['']
    # The working directory is the handler's import root and comes first;
    # '' (the current directory, which a handler may change) is dropped.
    sys.path[:] = [workdir] + [p for p in sys.path if p not in ('', workdir)]
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass
    module_name, _, attr = handler.rpartition('.')
    try:
        if module_name:
            _from_source(workdir, module_name)
        __import__(module_name)
        module = sys.modules[module_name]
        try:
            fn = getattr(module, attr)
        except AttributeError:
            where = getattr(module, '__file__', None) or module_name
            raise AttributeError(f'module {module_name!r} ({where}) has no '
                                 f'attribute {attr!r}') from None
        if not callable(fn):
            raise TypeError(f'{handler} is not callable: it is a '
                            f'{type(fn).__name__}')
        takes_context, is_async = _shape(fn)
        if is_async:
            _event_loop()  # pay for asyncio now, not on the first call
    except BaseException as exc:
        tb = exc.__traceback__
        _send(INIT_ERROR, _exception_payload(
            exc, tb.tb_next if tb is not None else None, limits))
        _flush()
        os._exit(1)
    return fn, takes_context


def main():
    handler = sys.argv[1]
    limits = [int(v) for v in sys.argv[2:7]]
    max_output, max_keys, max_outputs_total = limits[0], limits[1], limits[2]
    # Children the handler starts must not hold the protocol pipes.
    os.set_inheritable(REQ_FD, False)
    os.set_inheritable(RESP_FD, False)
    loads, dumps = _json_codec()
    if handler:
        workdir = os.environ.pop('__STOKE_WORKDIR')
        run_uid = os.environ.pop('__STOKE_RUN_UID')
    else:
        _send(SPARE)
        workdir, run_uid, handler = _handover()
    fn, takes_context = _load(workdir, handler, limits)
    _flush()  # what the import printed belongs before READY
    _send(READY, sys.version.split()[0].encode())

    while True:
        req = _read_request()
        if req is None:
            return  # the Go side closed the request pipe
        invocation_id, scope, data, remaining = req
        if scope:
            # Inherited by every process the handler starts, so that what
            # outlives the invocation is traced to it and killed.
            os.environ['STOKE_SCOPE'] = scope
        ctx = None
        exc = None
        result = None
        try:
            event = loads(data)
        except Exception as e:
            _flush()
            _send(ERROR, _error_payload('Runtime.InvalidInput',
                                        f'cannot decode the input: {e}', '',
                                        limits))
            continue
        del data
        try:
            if takes_context:
                ctx = Context(invocation_id, run_uid,
                              monotonic() + remaining / 1e9)
                result = fn(event, ctx)
            else:
                result = fn(event)
            if type(result) is _Coroutine:
                ok, result = _event_loop().run_until_complete(_guard(result))
                if not ok:
                    exc, result = result, None
        except SystemExit as e:
            _exit(e.code)
        except Exception as e:
            exc = e
        event = None

        if exc is not None:
            tb = exc.__traceback__
            payload = _exception_payload(
                exc, tb.tb_next if tb is not None else None, limits)
            exc = None
            _flush()
            _send(ERROR, payload)
            continue
        try:
            out = dumps(result)
        except Exception as e:
            payload = _error_payload(
                'Runtime.InvalidOutput',
                f'the handler result is not JSON serialisable: {e}', '',
                limits)
            result = None
            _flush()
            _send(ERROR, payload)
            continue
        result = None
        if len(out) > max_output:
            _flush()
            _send(ERROR, _error_payload(
                'Runtime.OutputTooLarge',
                f'handler output is {len(out)} bytes, at most {max_output} '
                'allowed', '', limits))
            continue
        tail = b''
        outputs = ctx._outputs if ctx is not None else None
        if outputs:
            size = sum(len(k) + len(v) for k, v in outputs.values())
            if len(outputs) > max_keys or size > max_outputs_total:
                _flush()
                _send(ERROR, _error_payload(
                    'Runtime.InvalidOutputs',
                    f'outputs: {len(outputs)} keys of {size} bytes in all, at '
                    f'most {max_keys} keys and {max_outputs_total} bytes '
                    'allowed', '', limits))
                continue
            tail = b''.join(_KV.pack(len(k), len(v)) + k + v
                            for k, v in outputs.values())
        ctx = None
        _flush()
        _send(OK, _U32.pack(len(out)) + out + tail)


main()
