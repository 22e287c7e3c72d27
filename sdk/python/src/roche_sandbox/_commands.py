# Generated from _acommands.py by sdk/python/unasync.py: do not edit. Edit _acommands.py, then
# run `python3 sdk/python/unasync.py` (a test fails while this file is stale).
"""Durable commands for the synchronous API, ``sandbox.commands``, shaped like E2B's: run a
shell command line (or an argv) in the foreground or the background, list the commands,
connect to one from byte offsets, feed its stdin, signal and kill it. A command belongs to
the sandbox, not to this process: it runs on when this process disconnects, is killed, or
roched restarts, and its output is kept in the sandbox for the next connection to replay."""

from __future__ import annotations

import time
import uuid
# typing.List: inside these classes "list" names their list() method.
from typing import Any, Iterator, Callable, List, Literal, Mapping, Optional, Sequence, Union, overload

from . import _syncio, _cmdwire
from ._cmdwire import UNSET, CommandAssembler
from ._deadline import Deadline
from .errors import RocheError, SandboxNotFound, SandboxTimeout
from .types import CommandInfo, CommandResult, OutputEvent

#: What on_stdout and on_stderr are: a function of each piece of output as text, in the
#: async API one that may be a coroutine function (it is awaited).
OnOutput = Callable[[str], Any]

#: How long a handle keeps trying to connect again after its connection broke (roched
#: restarting), before it gives up with the error.
RECONNECT_FOR = 60.0


class CommandHandle:
    """A command that runs on in the sandbox: started with ``run(background=True)`` or
    found with ``connect()``. ``wait()`` returns its CommandResult once it ends;
    iterating (``for event in handle``) yields its output as OutputEvents (with
    each piece's ``offset``), after which ``result`` is set. With ``on_stdout`` or
    ``on_stderr`` given, the output goes to them as it comes, from a thread of its own
    (in the async API, a task) instead. A connection that breaks (roched restarting) is
    made again from the offsets reached, so no byte is lost or repeated; ``disconnect()``
    stops reading, and the command goes on."""

    def __init__(self, commands: "Commands", pid: int, asm: CommandAssembler,
                 on_stdout: Optional[OnOutput], on_stderr: Optional[OnOutput]) -> None:
        self._c = commands
        self.pid = pid
        self._asm = asm
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self._disconnected = False
        #: How the command ended, once this handle has seen it end.
        self.result: Optional[CommandResult] = None
        self._reading: Optional[_syncio.Background[CommandResult]] = None
        if on_stdout is not None or on_stderr is not None:
            self._reading = _syncio.Background(self._read, f"roche-command-{pid}")

    @property
    def stdout_offset(self) -> int:
        """The offset of the next stdout byte this handle will see: connect() from here
        (with stderr_offset) to go on where it left off."""
        return int(self._asm.next["stdout"])

    @property
    def stderr_offset(self) -> int:
        return int(self._asm.next["stderr"])

    @property
    def stdout(self) -> str:
        """The stdout this handle has seen so far (E2B's name)."""
        return self._asm.result(_cmdwire.Ended(-1)).stdout

    @property
    def stderr(self) -> str:
        """The stderr this handle has seen so far (E2B's name)."""
        return self._asm.result(_cmdwire.Ended(-1)).stderr

    def _events(self) -> Iterator[OutputEvent]:
        """The output from where this handle is, connecting again after a broken
        connection for up to RECONNECT_FOR seconds; result is set at the end."""
        asm, t, sid = self._asm, self._c._sb._t, self._c._sb.id
        give_up: Optional[float] = None
        delay = 0.1
        while self.result is None:
            if self._disconnected:
                return
            try:
                for ev in t.connect_command(sid, {"pid": self.pid}, asm.next["stdout"], asm.next["stderr"],
                                            Deadline(None)):
                    give_up, delay = None, 0.1
                    if isinstance(ev, _cmdwire.Started):
                        asm.started(ev)
                    elif isinstance(ev, _cmdwire.Data):
                        out = asm.data(ev)
                        if out is not None:
                            yield out
                    else:
                        self.result = asm.result(ev)
                    if self._disconnected:
                        return
            except RocheError as e:
                if not _cmdwire.retryable(e):
                    raise
                now = time.monotonic()
                give_up = give_up or now + RECONNECT_FOR
                if now >= give_up:
                    raise
                _syncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def __iter__(self) -> Iterator[OutputEvent]:
        if self._reading is not None:
            raise RocheError("this handle's output goes to its on_stdout and on_stderr: use wait()")
        return self._events()

    def _read(self, on_stdout: Optional[OnOutput] = None,
              on_stderr: Optional[OnOutput] = None) -> CommandResult:
        on_stdout, on_stderr = on_stdout or self._on_stdout, on_stderr or self._on_stderr
        for ev in self._events():
            h = on_stderr if ev.stream == "stderr" else on_stdout
            if h is not None and ev.text:
                _syncio.call(h, ev.text)
        if self.result is None:
            raise RocheError(f"disconnected from command {self.pid} before it ended (it goes on)")
        return self.result

    def wait(self, on_stdout: Optional[OnOutput] = None, on_stderr: Optional[OnOutput] = None,
             timeout: Optional[float] = None) -> CommandResult:
        """Waits for the command to end and returns its CommandResult (a non-zero exit
        is a result; ``exit_code`` is -1 with ``unknown`` saying why when the status
        cannot be known). ``on_stdout``/``on_stderr`` get the rest of its output as text.
        SandboxTimeout when ``timeout`` seconds pass first (the command goes on)."""
        if self.result is not None:
            return self.result
        if self._reading is None:
            self._reading = _syncio.Background(lambda: self._read(on_stdout, on_stderr), f"roche-command-{self.pid}")
        if not self._reading.wait(timeout):
            raise SandboxTimeout(f"timed out: command {self.pid} did not end within {timeout:g} s (it goes on)")
        return self._reading.result()

    def kill(self) -> bool:
        """Kills the command and everything it started (SIGKILL to its process group);
        False when it had already ended."""
        return self._c.kill(self.pid)

    def signal(self, sig: Union[int, str]) -> None:
        """Sends a signal (15, "TERM", "SIGINT", ...) to the command's process group."""
        self._c.signal(self.pid, sig)

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Writes data to the command's stdin (started with ``stdin=True``)."""
        self._c.send_stdin(self.pid, data)

    def close_stdin(self) -> None:
        """Closes the command's stdin: it reads end of file from then on."""
        self._c.close_stdin(self.pid)

    def disconnect(self) -> None:
        """Stops reading the command's output; the command goes on (``connect()`` it
        again from ``stdout_offset`` and ``stderr_offset``)."""
        self._disconnected = True


class Commands:
    """``sandbox.commands``: durable commands in a sandbox, E2B's calls by E2B's names."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _deadline(self) -> Deadline:
        d: Deadline = self._sb._roche._deadline()
        return d

    @overload
    def run(self, cmd: Union[str, Sequence[str]], background: Literal[False] = False, *,
            cwd: Optional[str] = None, envs: Optional[Mapping[str, str]] = None, tag: Optional[str] = None,
            stdin: bool = False, on_stdout: Optional[OnOutput] = None,
            on_stderr: Optional[OnOutput] = None, timeout: Optional[float] = UNSET,
            window: Optional[int] = None, idempotency_key: Optional[str] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: Union[str, Sequence[str]], background: Literal[True], *,
            cwd: Optional[str] = None, envs: Optional[Mapping[str, str]] = None, tag: Optional[str] = None,
            stdin: bool = False, on_stdout: Optional[OnOutput] = None,
            on_stderr: Optional[OnOutput] = None, timeout: Optional[float] = UNSET,
            window: Optional[int] = None, idempotency_key: Optional[str] = None) -> "CommandHandle": ...

    def run(self, cmd: Union[str, Sequence[str]], background: bool = False, *,
            cwd: Optional[str] = None, envs: Optional[Mapping[str, str]] = None, tag: Optional[str] = None,
            stdin: bool = False, on_stdout: Optional[OnOutput] = None,
            on_stderr: Optional[OnOutput] = None, timeout: Optional[float] = UNSET,
            window: Optional[int] = None,
            idempotency_key: Optional[str] = None) -> Union[CommandResult, "CommandHandle"]:
        """Runs ``cmd``, a shell command line (run by the image's ``bash -l -c``, else
        ``sh -c``) or an argv list, as the sandbox user under every limit of the sandbox.

        In the foreground it returns the CommandResult once the command ends (a non-zero
        exit is a result, not an exception); ``timeout`` (default 60 s; 0 or None: the
        sandbox's lifetime) kills it and sets ``timed_out``. With ``background=True`` it
        returns an CommandHandle at once, and the command runs until it ends, is
        killed, or the sandbox ends (``timeout`` bounds it when given). Either way the
        command belongs to the sandbox: a dropped connection is made again from the
        offsets reached, and cancelling a foreground run kills its command.

        ``cwd`` and ``envs`` set its working directory and add to its environment;
        ``tag`` names it for list() and the other calls; ``stdin=True`` keeps its stdin
        open for send_stdin until close_stdin; ``on_stdout``/``on_stderr`` get its
        output as text as it comes. ``window`` is the output kept per stream in the
        sandbox for a later connect (default 16 MiB, at most 64 MiB).
        ``idempotency_key`` makes a repeated run with the key join the first one's
        command instead of starting another (a run makes one of its own, so that its
        retries after a dropped connection start it once).
        """
        key = idempotency_key or ("run-" + uuid.uuid4().hex)
        req = _cmdwire.make_command_request(cmd, background, cwd, envs, tag, stdin, timeout, window, key)
        if background:
            info = self._start(req)
            return CommandHandle(self, info.pid, CommandAssembler(), on_stdout, on_stderr)
        try:
            info = self._start(req)
        except SandboxNotFound as e:
            failed = _start_failure(e)
            if failed is None:
                raise
            return failed
        h = CommandHandle(self, info.pid, CommandAssembler(), None, None)
        try:
            for ev in h._events():
                handler = on_stderr if ev.stream == "stderr" else on_stdout
                if handler is not None and ev.text:
                    _syncio.call(handler, ev.text)
        except BaseException:
            # Given up by its caller (cancelled, interrupted): a foreground command goes too.
            if h.result is None:
                try:
                    _syncio.uncancellable(lambda: self.kill(info.pid))
                except RocheError:
                    pass
            raise
        if h.result is None:
            raise RocheError(f"the connection to command {info.pid} ended before it did")
        return h.result

    def _start(self, req: _cmdwire.CommandRequest) -> CommandInfo:
        """Starts req, trying again with its idempotency key while roched cannot be
        reached (a start whose answer was lost is not started twice)."""
        give_up: Optional[float] = None
        delay = 0.1
        while True:
            try:
                return self._sb._t.start_command(self._sb.id, req, self._deadline())
            except RocheError as e:
                if not _cmdwire.retryable(e) or req.key is None:
                    raise
                now = time.monotonic()
                give_up = give_up or now + RECONNECT_FOR
                if now >= give_up:
                    raise
                _syncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def list(self) -> List[CommandInfo]:
        """The sandbox's commands, running or ended (the last 64 ended are kept), oldest
        first, with what each keeps of its output."""
        return self._sb._t.list_commands(self._sb.id, self._deadline())

    def connect(self, pid: Optional[int] = None, stdout_offset: int = 0, stderr_offset: int = 0, *,
                tag: Optional[str] = None, on_stdout: Optional[OnOutput] = None,
                on_stderr: Optional[OnOutput] = None) -> CommandHandle:
        """A handle on a command started before (by this process or another: its pid,
        or ``tag=``), whose output is replayed from the byte offsets given (0: from its
        start; -1: only what comes next) and then followed. An offset that fell out of
        the command's window raises OutputGone naming the first offset still kept."""
        sel = _cmdwire.selector(pid, tag)
        asm = CommandAssembler(_cmdwire.offset(stdout_offset, "stdout_offset"), _cmdwire.offset(stderr_offset, "stderr_offset"))
        if "tag" in sel:
            pid = self._pid_of(sel["tag"])
        assert pid is not None
        return CommandHandle(self, pid, asm, on_stdout, on_stderr)

    def _pid_of(self, tag: str) -> int:
        found = [c for c in self.list() if c.tag == tag]
        if not found:
            raise SandboxNotFound(f"not found: no command tagged {tag!r} in sandbox {self._sb.id}")
        return max(found, key=lambda c: (c.started_at is not None, c.started_at, c.pid)).pid

    def send_stdin(self, pid: Optional[int], data: Union[bytes, str], *, tag: Optional[str] = None) -> None:
        """Writes data to the stdin of a command started with ``stdin=True``."""
        sel = _cmdwire.selector(pid, tag)
        for piece in _cmdwire.input_pieces(data):
            self._sb._t.send_command_input(self._sb.id, sel, piece, self._deadline())

    def close_stdin(self, pid: Optional[int] = None, *, tag: Optional[str] = None) -> None:
        """Closes a command's stdin: it reads end of file from then on."""
        self._sb._t.close_command_input(self._sb.id, _cmdwire.selector(pid, tag), self._deadline())

    def kill(self, pid: Optional[int] = None, *, tag: Optional[str] = None) -> bool:
        """Kills a command and everything it started (SIGKILL to its process group);
        False when there was no such command running (E2B's answer)."""
        try:
            self._sb._t.signal_command(self._sb.id, _cmdwire.selector(pid, tag), 9, self._deadline())
        except SandboxNotFound:
            return False
        return True

    def signal(self, pid: Optional[int], sig: Union[int, str], *, tag: Optional[str] = None) -> None:
        """Sends a signal (15, "TERM", "SIGINT", ...) to a command's process group."""
        self._sb._t.signal_command(self._sb.id, _cmdwire.selector(pid, tag), _cmdwire.signal_number(sig),
                                   self._deadline())


def _start_failure(e: SandboxNotFound) -> Optional[CommandResult]:
    """A foreground argv whose program could not start is a result, as a shell reports
    it (127 not found, 126 not executable), not an exception: the agent refuses the
    start with its own message ("roche-agent: PROG: command not found")."""
    i = e.message.find("roche-agent: ")
    if i < 0:
        return None
    msg = e.message[i:].strip()
    code = 127 if msg.endswith("command not found") or msg.lower().endswith("no such file or directory") else 126
    return CommandResult(stdout="", stderr=msg + "\n", exit_code=code)
