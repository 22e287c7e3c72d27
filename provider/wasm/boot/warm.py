# Roche's wasm provider starts CPython ahead of an exec with this program (see warm.go), so
# that the exec does not wait for the interpreter to initialise. It is passed as sys.argv[1]
# of `python3 -c "exec(compile(sys.argv[1], ...), {...})"` and runs in a namespace of its
# own, so __main__ stays as a fresh interpreter has it. It reads one request from stdin,
# sets the process up as `python3 -c CODE ARGS...` or `python3 SCRIPT ARGS...` would have
# it once Roche's start-up hook (sitecustomize.py) had run, and runs that program. The
# interpreter exits with the program: an instance never serves a second request.
#
# Loaded by sitecustomize.py with _roche_preinit set, it instead prepares a
# pre-initialised interpreter (preinit.go): it tells the host where _entry is, and the
# host copies the interpreter once it has started. Each run from that copy enters
# _entry, which serves one request as above.
#
# The request: ten ASCII digits giving the length of the rest, then NUL-separated UTF-8
# fields: "c" or "f" (command or file), the working directory, the number of argv
# entries, the argv entries (options before -c, if any, are those the interpreter
# started with), then the environment as KEY=VALUE entries in order.
import os as _os
import sys as _sys


def _read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = _os.read(0, n - len(buf))
        if not chunk:
            # The host discarded this instance before handing it a program.
            _os._exit(0)
        buf += chunk
    return buf


def _serve():
    _fields = [_os.fsdecode(f) for f in _read_exact(int(_read_exact(10))).split(b"\0")]
    _kind, _workdir, _argc = _fields[0], _fields[1], int(_fields[2])
    _argv = _fields[3 : 3 + _argc]

    # The environment a fresh interpreter would have after sitecustomize.py: only what the
    # exec gives (os.environ is posix.environ here, so both change, and so does the C one).
    _os.environ.clear()
    for _kv in _fields[3 + _argc :]:
        _k, _, _v = _kv.partition("=")
        _os.environ[_k] = _v

    try:
        _os.chdir(_workdir)
    except Exception as _err:
        # What site.py prints when sitecustomize.py fails this way in a fresh interpreter.
        _sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
            % (_err.__class__.__name__, _err)
        )

    _main = _sys.modules["__main__"]
    _globals = _main.__dict__
    _sys.orig_argv = list(_argv)
    if _kind == "c":
        # Options before -c (a code context's kernel's -u) were the interpreter's own:
        # the copy it entered from was made with them.
        _at = _argv.index("-c")
        _filename = "<string>"
        _source = _argv[_at + 1]
        _sys.argv = ["-c"] + _argv[_at + 2 :]
    else:
        _filename = _argv[1]
        _sys.argv = _argv[1:]
        _sys.path[0] = _os.path.dirname(_filename)
        try:
            with open(_filename, "rb") as _f:
                _source = _f.read()
            del _f
        except OSError as _err:
            _sys.stderr.write(
                "%s: can't open file %r: [Errno %d] %s\n"
                % (_argv[0], _filename, _err.errno, _err.strerror)
            )
            raise SystemExit(2)
        _globals["__file__"] = _filename
        _globals["__cached__"] = None
        _globals["__loader__"] = _sys.modules[
            "_frozen_importlib_external"
        ].SourceFileLoader("__main__", _filename)


    def _forget_file():
        if _kind == "f":
            _globals.pop("__file__", None)
            _globals.pop("__cached__", None)


    def _own_frames_off(tb):
        # The traceback of an exception caught here starts at this frame; a fresh
        # interpreter's has nothing below the program's own frame.
        if tb is not None and tb.tb_frame is _sys._getframe(1):
            tb = tb.tb_next
        return tb


    _exc = None
    try:
        _code = compile(_source, _filename, "exec", dont_inherit=True)
        del _source
        exec(_code, _globals)
    except SystemExit:
        _forget_file()
        raise
    except BaseException as _e:
        _exc = _e

    if _exc is None:
        _forget_file()
    else:
        # What PyErr_Print does for an uncaught exception, outside any except block as it
        # is there, so that an exception raised by the hook has no context.
        _tb = _own_frames_off(_exc.__traceback__)
        _exc.__traceback__ = _tb
        _sys.last_exc = _sys.last_value = _exc
        _sys.last_type = type(_exc)
        _sys.last_traceback = _tb
        _hook = getattr(_sys, "excepthook", None)
        _sys.audit("sys.excepthook", _hook, type(_exc), _exc, _tb)
        _hook_exc = None
        if _hook is None:
            _sys.stderr.write("sys.excepthook is missing\n")
            _sys.__excepthook__(type(_exc), _exc, _tb)
        else:
            try:
                _hook(type(_exc), _exc, _tb)
            except SystemExit:
                raise
            except BaseException as _e:
                _hook_exc = _e
        if _hook_exc is not None:
            _hook_exc.__traceback__ = _own_frames_off(_hook_exc.__traceback__)
            _sys.stderr.write("Error in sys.excepthook:\n")
            _sys.__excepthook__(type(_hook_exc), _hook_exc, _hook_exc.__traceback__)
            _sys.stderr.write("\nOriginal exception was:\n")
            _sys.__excepthook__(type(_exc), _exc, _tb)
        _forget_file()
        # An uncaught KeyboardInterrupt (exactly that class) makes CPython exit as if
        # interrupted, 130; any other exception exits 1.
        raise SystemExit(130 if type(_exc) is KeyboardInterrupt else 1)


# Exit at CPython's teardown. Once every module has been cleared and sys.stdout and
# sys.stderr flushed, CPython clears its own state (the interpreter's, its types and
# strings), ~4 ms that nothing of the program observes, since this instance is thrown
# away after its one run. An audit hook added as the program ends sees the event raised
# as that clearing begins and ends the instance there with the exit status CPython would
# give, when that status is known here: the program ended by plain SystemExit (or
# returned, or failed with an exception, which _serve turns into one) with a code from 0
# to 255, and no flush at exit failed (that reports an unraisable exception and makes the
# status 120). Otherwise CPython's own exit runs as ever. The hook is added only then: a
# hook in place while the program runs makes each of its audit events (every id(),
# exec, open...) several microseconds slower, even a builtin one. The program's own
# hooks, if it has any, see it added.
def _arm_teardown(exc):
    # The status CPython's handle_system_exit takes from a plain SystemExit.
    if type(exc) is not SystemExit:
        return
    code = 0 if exc.code is None else exc.code
    if type(code) is not int or not 0 <= code <= 255:
        return
    armed = [code]

    def _at_teardown(event, args, _armed=armed, _exit=_os._exit, _sysdict=_sys.__dict__):
        # Called also after the builtins are cleared: no globals or builtins here. sys's
        # entries are None by then but still there; an absent unraisablehook means a
        # failed flush may have gone unaudited.
        if event == "sys.unraisablehook":
            _armed[0] = None
        elif event == "cpython.PyInterpreterState_Clear" and _armed[0] is not None and "unraisablehook" in _sysdict:
            _exit(_armed[0])

    try:
        _sys.addaudithook(_at_teardown)
    except BaseException:
        pass  # a hook of the program's refused it: CPython's own exit runs


def _entry():
    # Entered by the host in a copy of an interpreter that stopped as it read its
    # program, with no Python frame running.
    # What the copy shares with every run made from it is renewed first: the random
    # module's state, if imported. (The import system's directory caches are not
    # emptied, which in 3.12 imports importlib.metadata, ~50 ms: the copy has cached
    # only directories whose contents are python.wasm's or Roche's, the standard library
    # and /.roche, as a fresh interpreter has when it runs the program.)
    # The copy stopped while CPython ran `python3 -` (reading the program from stdin),
    # which gave __main__ the __file__ "<stdin>": the program gets a __main__ of its own
    # with the entries a fresh interpreter's has.
    _old = _sys.modules["__main__"]
    _new = type(_sys)("__main__")
    _new.__dict__.update(_old.__dict__)
    _new.__dict__.pop("__file__", None)
    _new.__dict__.pop("__cached__", None)
    _sys.modules["__main__"] = _new
    del _old, _new
    if "random" in _sys.modules:
        _sys.modules["random"].seed()
    try:
        _serve()
        # The host ends the interpreter as CPython does an uncaught SystemExit.
        raise SystemExit
    except SystemExit as _e:
        _arm_teardown(_e)
        raise


if globals().get("_roche_preinit"):
    for _m in _roche_preload:
        __import__(_m)
    # What start-up made goes to the collector's permanent generation, which no
    # collection traverses: not the program's, nor the three of finalisation, which
    # otherwise walk every module, function and type of the interpreter's start at each
    # run's exit. The program's own objects are collected as before. (gc leaves
    # sys.modules as it was: a fresh interpreter has not imported it.)
    __import__("gc").freeze()
    del _sys.modules["gc"]
    _os.write(1, b"\0roche-preinit %d %d %d\n" % (id(_entry), id(type(_entry)), id(())))
else:
    try:
        _serve()
        raise SystemExit
    except SystemExit as _e:
        _arm_teardown(_e)
        raise
