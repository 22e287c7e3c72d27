# Roche's code-context kernel: a small, stdlib-only interpreter loop that keeps one
# namespace across cells, as a Jupyter kernel does, without zmq or ipykernel, so it runs
# on every image that has python3 (python.wasm included). roche-agent (or the wasm
# provider) starts it, writes cells to it and reads events back.
#
# Channels. With --fds (roche-agent): this source arrives on stdin (read by a one-line
# python3 -c), cells on fd 3, events leave on fd 4, and fd 1 and fd 2 stay the raw stdout
# and stderr pipes that subprocesses and C code write to.
# With --stdio (python.wasm, which has no fds to spare): cells arrive on stdin and events
# leave on stdout; fd 2 stays raw stderr.
#
# A cell is one JSON line {"id": N, "code": "..."}. The line {"reseed": true} (roche-agent
# sends it to every kernel after its microVM was restored from a memory snapshot, whose
# copies would otherwise draw the same numbers) reseeds the random module's global
# generator, and numpy's legacy one if imported, from os.urandom; it has no event.
# The line {"fork": ADDR, "id": N} forks the kernel (a context's fork): a copy of this
# process, its namespace included, made a child of the agent's (a double fork, in a
# session of its own), connects to the abstract Unix socket ADDR, takes the four fds the
# agent sends there as its fd 1 to 4 and says ready (with its pid) on them; this kernel
# then ends request N with done, after an error event if the fork failed. Only the
# thread that forks is copied, as with os.fork.
# Events are JSON lines with a type "t":
#   ready   {"version": "3.11.2", "pid": 7}                     once, at start
#   out/err {"s": "text"}                                        Python-level writes, in order
#   result  {"data": {"text/plain": ..., "image/png": b64}, "main": bool}
#   error   {"name", "value", "traceback"}
#   done    {"id": N, "count": execution count}                  last event of a cell
# Before done, a sync mark "\x1eroche:sync:N\x1e" is written to raw fd 1 and fd 2, so the
# reader knows it has every byte a cell's subprocesses wrote there before it ended.
#
# An interrupt (SIGINT) raises KeyboardInterrupt in the running cell only: never while an
# event is half written, and not at all between cells.

import ast
import base64
import codecs
import io
import json
import linecache
import os
import signal
import sys
import threading
import traceback
import types


class _State:
    running = False  # a cell is executing: SIGINT raises KeyboardInterrupt
    critical = 0  # an event is being written: SIGINT is deferred
    pending = False  # a deferred SIGINT
    count = 0  # execution count
    cell = 0  # id of the running cell
    shown = set()  # ids of the figures already sent in this cell


_st = _State()
_EVT_FD = 4
_CMD_FD = 3
_SYNC = True


def _on_sigint(signum, frame):
    if not _st.running:
        return
    if _st.critical:
        _st.pending = True
        return
    raise KeyboardInterrupt


_send_lock = threading.Lock()  # threads print too: one event at a time on the pipe


def _send(obj):
    data = (json.dumps(obj) + "\n").encode()
    _st.critical += 1
    try:
        with _send_lock:
            view = memoryview(data)
            while view:
                n = os.write(_EVT_FD, view)
                view = view[n:]
    finally:
        _st.critical -= 1
    if _st.pending and not _st.critical and _st.running:
        _st.pending = False
        raise KeyboardInterrupt


class _Binary(io.RawIOBase):
    """sys.stdout.buffer: bytes decoded as UTF-8 (split sequences kept for the next write)."""

    def __init__(self, text):
        self._text = text
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self):
        return True

    def write(self, b):
        self._text.write(self._dec.decode(bytes(b)))
        return len(b)

    def flush(self):
        self._text.flush()


class _Stream(io.TextIOBase):
    """sys.stdout and sys.stderr: line-buffered writes sent as out/err events, so that
    what a cell prints arrives in order with its results, as it is produced."""

    def __init__(self, kind, fd):
        self._kind = kind
        self._fd = fd
        self._buf = []
        self._binary = None

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    @property
    def buffer(self):
        if self._binary is None:
            self._binary = _Binary(self)
        return self._binary

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if not s:
            return 0
        self._buf.append(s)
        if "\n" in s or sum(map(len, self._buf)) > 8192:
            self.flush()
        return len(s)

    def flush(self):
        if self._buf:
            s = "".join(self._buf)
            self._buf = []
            _send({"t": self._kind, "s": s})


_stdout = _Stream("out", 1)
_stderr = _Stream("err", 2)


def _flush():
    _stdout.flush()
    _stderr.flush()


# Rich results, after IPython's display protocol: an object's _repr_*_ methods.
_REPRS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
)


def _encode(mime, v):
    if isinstance(v, tuple):  # (data, metadata)
        v = v[0]
    if v is None:
        return None
    if mime in ("image/png", "image/jpeg"):
        if isinstance(v, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(v)).decode("ascii")
        return str(v)
    if mime == "application/json":
        return v if isinstance(v, str) else json.dumps(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _is_figure(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, mod.Figure)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _format(obj):
    data = {}
    if not isinstance(obj, type):  # a class's _repr_html_ is an unbound function
        bundle = getattr(obj, "_repr_mimebundle_", None)
        if callable(bundle):
            try:
                b = bundle()
                if isinstance(b, tuple):
                    b = b[0]
                for mime, v in (b or {}).items():
                    v = _encode(mime, v)
                    if v is not None:
                        data[mime] = v
            except Exception:
                pass
        for mime, name in _REPRS:
            if mime in data:
                continue
            f = getattr(obj, name, None)
            if not callable(f):
                continue
            try:
                v = _encode(mime, f())
            except Exception:
                continue
            if v is not None:
                data[mime] = v
        if _is_figure(obj) and "image/png" not in data:
            try:
                data["image/png"] = _figure_png(obj)
                _st.shown.add(id(obj))
            except Exception:
                pass
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<repr failed: %s: %s>" % (type(e).__name__, e)
    return data


def display(*objs, raw=False):
    """Sends each object as a rich result (HTML, images, ...) of the running cell."""
    _flush()
    for obj in objs:
        data = obj if raw and isinstance(obj, dict) else _format(obj)
        _send({"t": "result", "data": data, "main": False})


def _emit_figures(close=True):
    """Sends every open matplotlib figure as a PNG result, then closes them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    _flush()
    try:
        nums = plt.get_fignums()
    except Exception:
        return
    for num in nums:
        fig = plt.figure(num)
        if id(fig) in _st.shown:
            continue
        try:
            _send({"t": "result", "data": {"image/png": _figure_png(fig), "text/plain": repr(fig)}, "main": False})
        except KeyboardInterrupt:
            raise
        except Exception as e:
            _stderr.write("roche: could not render figure %s: %s: %s\n" % (num, type(e).__name__, e))
    if close and nums:
        plt.close("all")


# A matplotlib backend of our own (MPLBACKEND=module://roche_kernel_backend): Agg for the
# drawing, and a show() that sends the open figures as PNG results.
_BACKEND_NAME = "roche_kernel_backend"
_BACKEND_SOURCE = """
import matplotlib.backends.backend_agg as _agg
from matplotlib.backend_bases import FigureManagerBase as _FigureManagerBase
FigureCanvas = _agg.FigureCanvasAgg
FigureManager = getattr(_agg, "FigureManager", _FigureManagerBase)
for _name in ("new_figure_manager", "new_figure_manager_given_figure", "draw_if_interactive"):
    if hasattr(_agg, _name):
        globals()[_name] = getattr(_agg, _name)

def show(*args, **kwargs):
    _roche_emit_figures()
"""


class _BackendFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != _BACKEND_NAME:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, cls)

    @classmethod
    def create_module(cls, spec):
        return None

    @classmethod
    def exec_module(cls, module):
        module.__dict__["_roche_emit_figures"] = _emit_figures
        exec(compile(_BACKEND_SOURCE, "<roche-kernel-backend>", "exec"), module.__dict__)


def _user_tb(tb):
    """The traceback from the first frame of the cell's own code on."""
    t = tb
    while t is not None and not t.tb_frame.f_code.co_filename.startswith("<cell-"):
        t = t.tb_next
    return t or tb


def _hide_kernel(te, seen=None):
    """Drops the kernel's own frames (its SIGINT handler, where a timeout's
    KeyboardInterrupt is raised; its output writers) from a traceback and the ones it
    chains: they are not the user's code, and name a file the user cannot open."""
    seen = set() if seen is None else seen
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not (f.filename or "").startswith("<roche-kernel")])
    _hide_kernel(te.__cause__, seen)
    _hide_kernel(te.__context__, seen)


def _send_error(e):
    if isinstance(e, SyntaxError) and (e.filename or "").startswith("<cell-"):
        tb = "".join(traceback.format_exception_only(type(e), e))
    else:
        te = traceback.TracebackException(type(e), e, _user_tb(e.__traceback__))
        _hide_kernel(te)
        tb = "".join(te.format())
    _send({"t": "error", "name": type(e).__name__, "value": str(e), "traceback": tb})


_ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
_loop = None


def _run(code):
    global _loop
    filename = "<cell-%d>" % _st.count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    value = None
    for node, mode in ((tree, "exec"), (last, "eval")):
        if node is None or (mode == "exec" and not node.body):
            continue
        c = compile(node, filename, mode, flags=flags, dont_inherit=True)
        r = eval(c, _ns)
        if c.co_flags & 0x80:  # CO_COROUTINE: the cell awaits at top level
            if _loop is None:
                import asyncio

                _loop = asyncio.new_event_loop()
            r = _loop.run_until_complete(r)
        if mode == "eval":
            value = r
    _flush()
    _emit_figures()
    if value is not None:
        _ns["_"] = value
        _send({"t": "result", "data": _format(value), "main": True})


def _cell(msg):
    _st.count += 1
    _st.cell = msg.get("id", 0)
    _st.shown = set()
    _st.pending = False
    _st.running = True
    try:
        try:
            _run(msg.get("code", ""))
        except BaseException as e:  # KeyboardInterrupt and SystemExit included
            _st.running = False
            _flush()
            try:
                _emit_figures()
            except BaseException:
                pass
            _send_error(e)
    finally:
        _st.running = False
    _flush()
    if _SYNC:
        mark = ("\x1eroche:sync:%d\x1e" % _st.cell).encode()
        for fd in (1, 2):
            try:
                os.write(fd, mark)
            except OSError:
                pass
    _send({"t": "done", "id": _st.cell, "count": _st.count})


def _reseed():
    """Reseeds, from os.urandom, the generators a snapshot's copies would share: the
    random module's global one and numpy's legacy global one. Generators a program made
    itself (random.Random(), numpy.random.default_rng()) keep their state."""
    r = sys.modules.get("random")
    if r is not None:
        r.seed()
    np = sys.modules.get("numpy.random")
    if np is not None:
        try:
            np.seed()
        except Exception:
            pass


def _fork(msg):
    """Serves a fork request; returns True in the new kernel, which then reads its own
    cell pipe."""
    global _send_lock
    import socket
    import warnings

    rid = msg.get("id", 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "this process is multi-threaded"
            mid = os.fork()
        if mid == 0:
            # The middle process: gone at once, so that the new kernel is the agent's
            # child and outside this kernel's tree, whose end it must not share.
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
            except BaseException:
                os._exit(1)
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect("\0" + msg["fork"])
                _, fds, _, _ = socket.recv_fds(s, 16, 4)
                s.close()
                if len(fds) != 4:
                    os._exit(1)
                for i, fd in enumerate(fds):
                    os.dup2(fd, i + 1)
                    os.close(fd)
                os.set_inheritable(_CMD_FD, False)
                os.set_inheritable(_EVT_FD, False)
            except BaseException:
                os._exit(1)
            _send_lock = threading.Lock()  # another thread may have held it
            _st.running = False
            _st.critical = 0
            _st.pending = False
            _send({"t": "ready", "version": sys.version.split()[0], "pid": os.getpid()})
            return True
        os.waitpid(mid, 0)
    except Exception as e:
        _send_error(e)
    _send({"t": "done", "id": rid, "count": _st.count})
    return False


def _reader(fd):
    buf = b""
    while True:
        while b"\n" not in buf:
            try:
                chunk = os.read(fd, 1 << 16)
            except KeyboardInterrupt:
                continue
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        if line.strip():
            yield line


def main():
    global _EVT_FD, _CMD_FD, _SYNC
    if "--stdio" in sys.argv:
        _CMD_FD, _EVT_FD, _SYNC = 0, 1, False
    else:
        for fd in (_CMD_FD, _EVT_FD):
            os.set_inheritable(fd, False)
    os.environ.setdefault("MPLBACKEND", "module://" + _BACKEND_NAME)
    if os.environ["MPLBACKEND"].lower() == "agg":
        os.environ["MPLBACKEND"] = "module://" + _BACKEND_NAME
    if "MPLCONFIGDIR" not in os.environ and not os.access(os.path.expanduser("~"), os.W_OK):
        # matplotlib caches fonts under ~/.config; a read-only home would make it warn
        # on every cell's stderr. Only where matplotlib is installed.
        import importlib.util
        import tempfile

        try:
            if importlib.util.find_spec("matplotlib") is not None:
                os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="matplotlib-")
        except (OSError, ValueError, ImportError):
            pass
    sys.meta_path.insert(0, _BackendFinder)
    if hasattr(signal, "SIGINT"):
        try:
            signal.signal(signal.SIGINT, _on_sigint)
        except (ValueError, OSError):
            pass
    sys.stdout, sys.stderr = _stdout, _stderr
    try:
        sys.stdin = open(os.devnull)
    except OSError:  # python.wasm has no /dev/null
        sys.stdin = io.StringIO()
    import builtins

    builtins.display = display
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.modules["__main__"].__dict__.update(_ns)
    _ns.clear()
    globals()["_ns"] = sys.modules["__main__"].__dict__
    pid = os.getpid() if hasattr(os, "getpid") else 0
    _send({"t": "ready", "version": sys.version.split()[0], "pid": pid})
    while _serve():
        pass


def _serve():
    """Runs what comes on the cell pipe until it ends (False), or until this process is a
    new kernel forked from it (True), which reads its own."""
    for line in _reader(_CMD_FD):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("reseed"):
            _reseed()
            continue
        if isinstance(msg, dict) and msg.get("fork") and not _SYNC:
            _send({"t": "error", "name": "NotImplementedError", "value": "this kernel cannot fork", "traceback": ""})
            _send({"t": "done", "id": msg.get("id", 0), "count": _st.count})
            continue
        if isinstance(msg, dict) and msg.get("fork"):
            if _fork(msg):
                return True
            continue
        _cell(msg)
    return False


if __name__ == "__main__":
    main()
