# Generated from _apty.py by sdk/python/unasync.py: do not edit. Edit _apty.py, then
# run `python3 sdk/python/unasync.py` (a test fails while this file is stale).
"""PTY sessions for the synchronous API: a command on a pseudo-terminal in the sandbox
(default: the image's shell), driven with unary calls (input, resize, kill) and one server
stream of its output, read by a thread of its own. Shaped like E2B's ``sandbox.pty``."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import _syncio, _wire
from ._transport import ConnectClient
from ._deadline import Deadline
from .errors import RocheError, SandboxTimeout, Unsupported
from .types import ExecResult

#: What on_data is: a function of each piece of output, in the async API one that may
#: be a coroutine function (it is awaited).
OnData = Callable[[bytes], Any]

#: The most bytes one send_input carries (the agent's frame).
MAX_INPUT = _wire.PTY_MAX_INPUT

_CLI_REFUSAL = ("PTY sessions need roched (the CLI transport has no way to keep a terminal between calls): "
                "start it with `roche daemon start`, or open one interactively with `roche shell ID`")


def _need_daemon(transport: Any) -> ConnectClient:
    if getattr(transport, "name", "") != "daemon":
        raise Unsupported(_CLI_REFUSAL)
    api: ConnectClient = transport.api
    return api


class PtyHandle:
    """A running PTY session. Its output goes to ``on_data`` (bytes, as the terminal
    writes them: escape sequences and all) from a thread of its own (in the async API, a
    task), or, without ``on_data``, into ``output``. ``wait()`` returns its ExecResult
    when it ends."""

    def __init__(self, http: ConnectClient, sid: str, pid: int, on_data: Optional[OnData],
                 request_timeout: float) -> None:
        self._api, self._sid, self.pid = http, sid, pid
        self._on_data = on_data
        self._timeout = request_timeout
        self.output = bytearray()
        self.result: Optional[ExecResult] = None
        self._reading = _syncio.Background(self._read, f"roche-pty-{pid}")

    def _read(self) -> ExecResult:
        body = _wire.envelope({"sandboxId": self._sid, "pid": self.pid})
        for m in self._api.stream("ConnectPty", body, Deadline(None)):
            data, result = _wire.pty_event(m)
            if data:
                if self._on_data is not None:
                    _syncio.call(self._on_data, data)
                else:
                    self.output += data
            if result is not None:
                self.result = result
                return result
        raise RocheError("roched ended the terminal's output stream without a result")

    def send_input(self, data: Union[bytes, str]) -> None:
        """Types data into the terminal: ``"ls\\n"``, ``"\\x03"`` (Ctrl-C), ``"\\x04"`` (Ctrl-D)."""
        self._api.unary("SendPtyInput", _wire.pty_input(self._sid, self.pid, data), Deadline(self._timeout))

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal's size; its program gets SIGWINCH."""
        self._api.unary("ResizePty", {"sandboxId": self._sid, "pid": self.pid, "size": _wire.pty_size(cols, rows)},
                        Deadline(self._timeout))

    def kill(self) -> None:
        """Kills the session's command and everything it started."""
        self._api.unary("KillPty", {"sandboxId": self._sid, "pid": self.pid}, Deadline(self._timeout))

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the session to end and returns its result (``exit_code``);
        SandboxTimeout when ``timeout`` seconds pass first (the session goes on)."""
        if not self._reading.wait(timeout):
            raise SandboxTimeout(f"timed out: the terminal {self.pid} did not end within {timeout:g} s (it still runs)")
        return self._reading.result()


class Pty:
    """``sandbox.pty``: terminals in a sandbox, through roched."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _api(self) -> ConnectClient:
        return _need_daemon(self._sb._t)

    def _deadline(self) -> Deadline:
        d: Deadline = self._sb._roche._deadline()
        return d

    def create(self, cols: int = 80, rows: int = 24, *, cmd: Optional[Sequence[str]] = None,
               on_data: Optional[OnData] = None, env: Optional[Mapping[str, str]] = None,
               workdir: Optional[str] = None) -> PtyHandle:
        """Starts ``cmd`` (default: the image's shell, /bin/bash else /bin/sh) on a
        terminal of cols x rows, as the sandbox user under every limit of the sandbox. It
        runs until it exits, ``kill()``, or the sandbox ends."""
        api = self._api()
        m = api.unary("CreatePty", _wire.pty_create_request(self._sb.id, cols, rows, cmd, env, workdir),
                      self._deadline())
        return PtyHandle(api, self._sb.id, int(m.get("pid", 0)), on_data, self._sb._roche._choice.request_timeout)

    def connect(self, pid: int, on_data: Optional[OnData] = None) -> PtyHandle:
        """A handle on a session started before: its recent output is replayed first."""
        return PtyHandle(self._api(), self._sb.id, pid, on_data, self._sb._roche._choice.request_timeout)

    def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        """Types data into session ``pid``."""
        self._api().unary("SendPtyInput", _wire.pty_input(self._sb.id, pid, data), self._deadline())

    #: E2B's name for send_input.
    send_stdin = send_input

    def resize(self, pid: int, cols: int, rows: int) -> None:
        """Resizes session ``pid``."""
        self._api().unary("ResizePty", {"sandboxId": self._sb.id, "pid": pid, "size": _wire.pty_size(cols, rows)},
                          self._deadline())

    def kill(self, pid: int) -> None:
        """Kills session ``pid``."""
        self._api().unary("KillPty", {"sandboxId": self._sb.id, "pid": pid}, self._deadline())
