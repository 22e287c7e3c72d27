"""PTY sessions: a command on a pseudo-terminal in the sandbox (default: the image's shell),
driven with unary calls (input, resize, kill) and one server stream of its output, so
they work over roched's plain HTTP/1.1. Shaped like E2B's ``sandbox.pty``."""

from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from . import _wire
from ._http import Deadline
from .errors import InvalidConfig, RocheError, SandboxTimeout, Unsupported
from .types import ExecResult

OnData = Callable[[bytes], Any]

_CLI_REFUSAL = ("PTY sessions need roched (the CLI transport has no way to keep a terminal between calls): "
                "start it with `roche daemon start`, or open one interactively with `roche shell ID`")

#: The most bytes one send_input carries (the agent's frame).
MAX_INPUT = 256 << 10


def _need_daemon(transport: Any) -> Any:
    if getattr(transport, "name", "") != "daemon":
        raise Unsupported(_CLI_REFUSAL)
    return transport.http


def _size(cols: int, rows: int) -> dict[str, int]:
    for name, v in (("cols", cols), ("rows", rows)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 4096:
            raise InvalidConfig(f"{name} {v!r}: give a number of characters from 1 to 4096")
    return {"cols": cols, "rows": rows}


def _create_request(sid: str, cols: int, rows: int, cmd: Optional[Sequence[str]],
                    env: Optional[Mapping[str, str]], workdir: Optional[str]) -> dict[str, Any]:
    m: dict[str, Any] = {"sandboxId": sid, "size": _size(cols, rows)}
    if cmd is not None:
        if isinstance(cmd, str) or not all(isinstance(a, str) for a in cmd):
            raise InvalidConfig("cmd must be a list of strings (the argv), e.g. ['python3']")
        m["cmd"] = list(cmd)
    if env:
        m["env"] = dict(env)
    if workdir:
        m["workdir"] = workdir
    return m


def _input(sid: str, pid: int, data: Union[bytes, str]) -> dict[str, Any]:
    if isinstance(data, str):
        data = data.encode()
    if len(data) > MAX_INPUT:
        raise InvalidConfig(f"{len(data)} bytes of input at once is over the limit of {MAX_INPUT}: send it in parts")
    return {"sandboxId": sid, "pid": pid, "data": base64.b64encode(bytes(data)).decode()}


def _event(m: dict[str, Any]) -> tuple[Optional[bytes], Optional[ExecResult]]:
    if "data" in m:
        return base64.b64decode(m["data"]), None
    if "result" in m:
        return None, _wire.parse_result(m["result"])
    return None, None  # a heartbeat


class PtyHandle:
    """A running PTY session. Its output goes to ``on_data`` (bytes, as the terminal
    writes them: escape sequences and all) from a thread of its own, or, without
    ``on_data``, into ``output``. ``wait()`` returns its ExecResult when it ends."""

    def __init__(self, http: Any, sid: str, pid: int, on_data: Optional[OnData], request_timeout: float) -> None:
        self._http, self._sid, self.pid = http, sid, pid
        self._on_data = on_data
        self._timeout = request_timeout
        self.output = bytearray()
        self.result: Optional[ExecResult] = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"roche-pty-{pid}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            body = _wire.envelope({"sandboxId": self._sid, "pid": self.pid})
            for m in self._http.stream("ConnectPty", body, Deadline(None)):
                data, result = _event(m)
                if data:
                    if self._on_data is not None:
                        self._on_data(data)
                    else:
                        self.output += data
                if result is not None:
                    self.result = result
                    return
            raise RocheError("roched ended the terminal's output stream without a result")
        except BaseException as e:  # handed to wait()
            self._error = e
        finally:
            self._done.set()

    def send_input(self, data: Union[bytes, str]) -> None:
        """Types data into the terminal: ``"ls\\n"``, ``"\\x03"`` (Ctrl-C), ``"\\x04"`` (Ctrl-D)."""
        self._http.unary("SendPtyInput", _input(self._sid, self.pid, data), Deadline(self._timeout))

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal's size; its program gets SIGWINCH."""
        self._http.unary("ResizePty", {"sandboxId": self._sid, "pid": self.pid, "size": _size(cols, rows)},
                         Deadline(self._timeout))

    def kill(self) -> None:
        """Kills the session's command and everything it started."""
        self._http.unary("KillPty", {"sandboxId": self._sid, "pid": self.pid}, Deadline(self._timeout))

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the session to end and returns its result (``exit_code``);
        SandboxTimeout when ``timeout`` seconds pass first (the session goes on)."""
        if not self._done.wait(timeout):
            raise SandboxTimeout(f"timed out: the terminal {self.pid} did not end within {timeout:g} s (it still runs)")
        if self._error is not None:
            raise self._error
        assert self.result is not None
        return self.result


class Pty:
    """``sandbox.pty``: terminals in a sandbox, through roched."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _http(self) -> Any:
        return _need_daemon(self._sb._t)

    def _deadline(self) -> Deadline:
        return self._sb._roche._deadline()

    def create(self, cols: int = 80, rows: int = 24, *, cmd: Optional[Sequence[str]] = None,
               on_data: Optional[OnData] = None, env: Optional[Mapping[str, str]] = None,
               workdir: Optional[str] = None) -> PtyHandle:
        """Starts ``cmd`` (default: the image's shell, /bin/bash else /bin/sh) on a
        terminal of cols x rows, as the sandbox user under every limit of the sandbox. It
        runs until it exits, ``kill()``, or the sandbox ends."""
        http = self._http()
        m = http.unary("CreatePty", _create_request(self._sb.id, cols, rows, cmd, env, workdir), self._deadline())
        return PtyHandle(http, self._sb.id, int(m.get("pid", 0)), on_data, self._sb._roche._choice.request_timeout)

    def connect(self, pid: int, on_data: Optional[OnData] = None) -> PtyHandle:
        """A handle on a session started before: its recent output is replayed first."""
        return PtyHandle(self._http(), self._sb.id, pid, on_data, self._sb._roche._choice.request_timeout)

    def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        """Types data into session ``pid``."""
        self._http().unary("SendPtyInput", _input(self._sb.id, pid, data), self._deadline())

    #: E2B's name for send_input.
    send_stdin = send_input

    def resize(self, pid: int, cols: int, rows: int) -> None:
        """Resizes session ``pid``."""
        self._http().unary("ResizePty", {"sandboxId": self._sb.id, "pid": pid, "size": _size(cols, rows)},
                           self._deadline())

    def kill(self, pid: int) -> None:
        """Kills session ``pid``."""
        self._http().unary("KillPty", {"sandboxId": self._sb.id, "pid": pid}, self._deadline())


AsyncOnData = Callable[[bytes], Union[None, Awaitable[None]]]


class AsyncPtyHandle:
    """A running PTY session (async). Its output goes to ``on_data`` (a function or a
    coroutine function) from a task of its own, or, without it, into ``output``."""

    def __init__(self, http: Any, sid: str, pid: int, on_data: Optional[AsyncOnData], request_timeout: float) -> None:
        self._http, self._sid, self.pid = http, sid, pid
        self._on_data = on_data
        self._timeout = request_timeout
        self.output = bytearray()
        self.result: Optional[ExecResult] = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> ExecResult:
        body = _wire.envelope({"sandboxId": self._sid, "pid": self.pid})
        async for m in self._http.stream("ConnectPty", body, Deadline(None)):
            data, result = _event(m)
            if data:
                if self._on_data is not None:
                    r = self._on_data(data)
                    if asyncio.iscoroutine(r):
                        await r
                else:
                    self.output += data
            if result is not None:
                self.result = result
                return result
        raise RocheError("roched ended the terminal's output stream without a result")

    async def send_input(self, data: Union[bytes, str]) -> None:
        """Types data into the terminal (``"\\x03"`` is Ctrl-C)."""
        await self._http.unary("SendPtyInput", _input(self._sid, self.pid, data), Deadline(self._timeout))

    async def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal's size; its program gets SIGWINCH."""
        await self._http.unary("ResizePty", {"sandboxId": self._sid, "pid": self.pid, "size": _size(cols, rows)},
                               Deadline(self._timeout))

    async def kill(self) -> None:
        """Kills the session's command and everything it started."""
        await self._http.unary("KillPty", {"sandboxId": self._sid, "pid": self.pid}, Deadline(self._timeout))

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the session to end and returns its result; SandboxTimeout when
        ``timeout`` seconds pass first (the session goes on)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            raise SandboxTimeout(f"timed out: the terminal {self.pid} did not end within {timeout:g} s (it still runs)") from None

    def close(self) -> None:
        """Stops reading the output (the session goes on)."""
        self._task.cancel()


class AsyncPty:
    """``sandbox.pty`` of an AsyncSandbox: terminals in a sandbox, through roched."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _http(self) -> Any:
        return _need_daemon(self._sb._t)

    def _deadline(self) -> Deadline:
        return self._sb._roche._deadline()

    async def create(self, cols: int = 80, rows: int = 24, *, cmd: Optional[Sequence[str]] = None,
                     on_data: Optional[AsyncOnData] = None, env: Optional[Mapping[str, str]] = None,
                     workdir: Optional[str] = None) -> AsyncPtyHandle:
        """Starts ``cmd`` (default: the image's shell) on a terminal of cols x rows; see Pty.create."""
        http = self._http()
        m = await http.unary("CreatePty", _create_request(self._sb.id, cols, rows, cmd, env, workdir), self._deadline())
        return AsyncPtyHandle(http, self._sb.id, int(m.get("pid", 0)), on_data, self._sb._roche._choice.request_timeout)

    async def connect(self, pid: int, on_data: Optional[AsyncOnData] = None) -> AsyncPtyHandle:
        """A handle on a session started before: its recent output is replayed first."""
        return AsyncPtyHandle(self._http(), self._sb.id, pid, on_data, self._sb._roche._choice.request_timeout)

    async def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        await self._http().unary("SendPtyInput", _input(self._sb.id, pid, data), self._deadline())

    #: E2B's name for send_input.
    send_stdin = send_input

    async def resize(self, pid: int, cols: int, rows: int) -> None:
        await self._http().unary("ResizePty", {"sandboxId": self._sb.id, "pid": pid, "size": _size(cols, rows)},
                                 self._deadline())

    async def kill(self, pid: int) -> None:
        await self._http().unary("KillPty", {"sandboxId": self._sb.id, "pid": pid}, self._deadline())
