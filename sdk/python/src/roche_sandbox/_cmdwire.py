"""Durable commands (``sandbox.commands``) on the wire: the requests and events of
roched's API in Connect's JSON, and the roche CLI's arguments and JSON lines for the
same calls. No I/O here; both halves and both transports share it."""

from __future__ import annotations

import base64
import codecs
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from ._tls import TLSFailure
from ._wire import parse_time
from .errors import InvalidConfig, ProviderUnavailable, RocheError
from .types import CommandInfo, CommandResult, OutputEvent, Stream

#: The most bytes one send_stdin carries (the agent's frame); more is sent in pieces.
MAX_INPUT = 256 << 10
#: How long a foreground run may take unless told otherwise (E2B's default).
DEFAULT_RUN_TIMEOUT = 60.0
#: The output a CommandResult keeps per stream.
KEEP_OUTPUT = 64 << 20
#: The most output a command keeps per stream in the sandbox (its window).
MAX_WINDOW = 64 << 20

#: A command line runs in the image's bash as a login shell, as E2B's SDKs run it
#: (/bin/bash -l -c LINE), and in sh where the image has no bash.
SHELL = ("/bin/sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash -l -c "$1"; fi; exec sh -c "$1"', "sh")


class _Unset:
    def __repr__(self) -> str:
        return "DEFAULT"


#: run()'s timeout when none is given: 60 s in the foreground, none in the background.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class CommandRequest:
    argv: tuple[str, ...]
    envs: Mapping[str, str]
    cwd: Optional[str]
    #: Seconds before the command is killed; None: the sandbox's remaining lifetime.
    timeout: Optional[float]
    tag: Optional[str]
    stdin: bool
    window: Optional[int]
    key: Optional[str]


def make_command_request(cmd: Union[str, Sequence[str]], background: bool, cwd: Optional[str],
                         envs: Optional[Mapping[str, str]], tag: Optional[str], stdin: bool, timeout: Any,
                         window: Optional[int], key: Optional[str]) -> CommandRequest:
    """run()'s arguments, checked: a string is a shell command line, a list the argv."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidConfig("invalid config: empty command: give a shell command line or the argv")
        argv: tuple[str, ...] = SHELL + (cmd,)
    elif isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd):
        argv = tuple(cmd)
    else:
        raise InvalidConfig("invalid config: cmd must be a shell command line (a string) or the argv (a list of strings)")
    if timeout is UNSET:
        timeout = None if background else DEFAULT_RUN_TIMEOUT
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise InvalidConfig(f"invalid config: timeout {timeout!r}: give seconds > 0, or 0 (or None) for the sandbox's lifetime")
        timeout = float(timeout) or None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or not 0 < window <= MAX_WINDOW):
        raise InvalidConfig(f"invalid config: window {window!r}: give bytes per stream, from 1 to {MAX_WINDOW} (64 MiB)")
    return CommandRequest(argv, dict(envs or {}), cwd or None, timeout, tag or None, bool(stdin), window, key or None)


def selector(pid: Optional[int], tag: Optional[str]) -> dict[str, Any]:
    """A CommandSelector: by pid, or by tag."""
    if pid is not None and tag is not None:
        raise InvalidConfig("invalid config: name the command by its pid or its tag, not both")
    if tag is not None:
        if not isinstance(tag, str) or not tag:
            raise InvalidConfig(f"invalid config: tag {tag!r}: give the tag the command was started with")
        return {"tag": tag}
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise InvalidConfig(f"invalid config: pid {pid!r}: give the pid run() returned (commands.list() shows them), or tag=")
    return {"pid": pid}


def offset(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidConfig(f"invalid config: {name} {v!r}: give a byte offset (an int; -1 for only what comes next)")
    return v


def input_pieces(data: Union[bytes, str]) -> list[bytes]:
    """What send_stdin sends, in pieces the agent takes."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidConfig("invalid config: send_stdin takes bytes or a str")
    data = bytes(data)
    return [data[i:i + MAX_INPUT] for i in range(0, len(data), MAX_INPUT)] or [b""]


def signal_number(sig: Union[int, str]) -> int:
    """A signal by number (15) or name ("TERM", "SIGTERM")."""
    if isinstance(sig, int) and not isinstance(sig, bool):
        if 0 < sig <= 64:
            return sig
    elif isinstance(sig, str):
        n = _SIGNALS.get(sig.upper().removeprefix("SIG"))
        if n:
            return n
    raise InvalidConfig(f"invalid config: {sig!r} is not a signal: give a number (1 to 64) or a name such as TERM, KILL, INT or HUP")


_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
            "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "CHLD": 17, "CONT": 18,
            "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26,
            "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31}


# What a connection to a command hears, from either transport.

@dataclass(frozen=True)
class Started:
    pid: int
    tag: Optional[str]
    stdout_offset: int
    stderr_offset: int


@dataclass(frozen=True)
class Data:
    stream: Stream
    offset: int
    data: bytes


@dataclass(frozen=True)
class Ended:
    exit_code: int
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    duration: float = 0.0
    unknown: str = ""


Event = Union[Started, Data, Ended]


class CommandAssembler:
    """Follows one command across connections: the offsets to connect from next, the
    output kept for its result (each stream up to KEEP_OUTPUT), and its text decoded
    with characters split across pieces decoded whole."""

    def __init__(self, stdout_offset: int = 0, stderr_offset: int = 0) -> None:
        self.next = {"stdout": stdout_offset, "stderr": stderr_offset}
        self.pid = 0
        self.tag: Optional[str] = None
        self._kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in self._kept}
        self.truncated = False

    def started(self, ev: Started) -> None:
        self.pid, self.tag = ev.pid, ev.tag
        # A negative offset asked for (only what comes next) is resolved by the start.
        self.next = {"stdout": ev.stdout_offset, "stderr": ev.stderr_offset}

    def data(self, ev: Data) -> Optional[OutputEvent]:
        """The output event for a piece, or None for bytes already seen (never the case
        with roched, which sends each byte once per connection)."""
        skip = self.next[ev.stream] - ev.offset
        if skip < 0:
            raise RocheError(f"the command's {ev.stream} skipped from offset {self.next[ev.stream]} to {ev.offset}: bytes were lost")
        data = ev.data[skip:]
        if not data:
            return None
        off = ev.offset + skip
        self.next[ev.stream] = off + len(data)
        kept = self._kept[ev.stream]
        room = KEEP_OUTPUT - len(kept)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            kept += data[:room]
        return OutputEvent(ev.stream, data, self._decoders[ev.stream].decode(data), off)

    def result(self, end: Ended) -> CommandResult:
        return CommandResult(
            stdout=bytes(self._kept["stdout"]).decode("utf-8", errors="replace"),
            stderr=bytes(self._kept["stderr"]).decode("utf-8", errors="replace"),
            exit_code=end.exit_code, pid=self.pid, signal=end.signal, timed_out=end.timed_out,
            oom_killed=end.oom_killed, duration=end.duration, unknown=end.unknown, truncated=self.truncated,
        )


# roched's API, in Connect's JSON (int64 fields travel as strings).

def _int(v: Any) -> int:
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


def _duration(s: Any) -> float:
    if isinstance(s, str) and s.endswith("s"):
        try:
            return float(s[:-1])
        except ValueError:
            return 0.0
    return 0.0


def start_request(sandbox_id: str, req: CommandRequest) -> dict[str, Any]:
    """A StartCommandRequest."""
    m: dict[str, Any] = {"sandboxId": sandbox_id, "cmd": list(req.argv)}
    if req.envs:
        m["env"] = dict(req.envs)
    if req.cwd:
        m["workdir"] = req.cwd
    if req.timeout:
        m["timeoutSecs"] = req.timeout
    if req.tag:
        m["tag"] = req.tag
    if req.stdin:
        m["stdin"] = True
    if req.window:
        m["window"] = str(req.window)
    if req.key:
        m["idempotencyKey"] = req.key
    return m


def connect_request(sandbox_id: str, sel: dict[str, Any], stdout_offset: int, stderr_offset: int) -> dict[str, Any]:
    """A ConnectCommandRequest."""
    return {"sandboxId": sandbox_id, "command": sel, "stdoutOffset": str(stdout_offset), "stderrOffset": str(stderr_offset)}


def input_request(sandbox_id: str, sel: dict[str, Any], data: bytes) -> dict[str, Any]:
    """A SendCommandInputRequest."""
    return {"sandboxId": sandbox_id, "command": sel, "data": base64.b64encode(data).decode("ascii")}


def parse_end(m: Any) -> Ended:
    """A CommandEnd message; a missing one is an unknown exit status, never exit 0."""
    if not isinstance(m, dict):
        return Ended(-1, unknown="roched sent no end")
    return Ended(
        exit_code=int(m.get("exitCode", 0)), signal=int(m.get("signal", 0)), timed_out=bool(m.get("timedOut")),
        oom_killed=bool(m.get("oomKilled")), duration=_duration(m.get("duration")), unknown=str(m.get("unknown", "")),
    )


def parse_command(m: Any) -> CommandInfo:
    """A Command message."""
    if not isinstance(m, dict):
        raise RocheError(f"roched sent {m!r} where a command was expected")
    end = m.get("end") if isinstance(m.get("end"), dict) else None
    first, written = m.get("first") or {}, m.get("written") or {}
    return CommandInfo(
        pid=int(m.get("pid", 0)), tag=m.get("tag") or None, argv=tuple(m.get("cmd") or ()), envs=dict(m.get("env") or {}),
        cwd=str(m.get("workdir", "")), running=bool(m.get("running")), stdin=bool(m.get("stdin")), pty=bool(m.get("tty")),
        started_at=parse_time(m.get("startedAt")), window=_int(m.get("window")),
        first_stdout=_int(first.get("stdout")), first_stderr=_int(first.get("stderr")),
        stdout_bytes=_int(written.get("stdout")), stderr_bytes=_int(written.get("stderr")),
        exit_code=None if end is None else int(end.get("exitCode", 0)),
        signal=0 if end is None else int(end.get("signal", 0)),
        unknown="" if end is None else str(end.get("unknown", "")),
    )


def daemon_event(m: dict[str, Any]) -> Optional[Event]:
    """One ConnectCommandResponse: a start, a piece of output, the end, or None (a
    heartbeat)."""
    if "start" in m:
        s = m["start"]
        return Started(int(s.get("pid", 0)), s.get("tag") or None, _int(s.get("stdoutOffset")), _int(s.get("stderrOffset")))
    if "data" in m:
        d = m["data"]
        stream: Stream = "stderr" if d.get("stream") == "OUTPUT_STREAM_STDERR" else "stdout"
        return Data(stream, _int(d.get("offset")), base64.b64decode(d.get("data") or ""))
    if "end" in m:
        return parse_end(m["end"])
    return None


# The roche CLI: roche exec --background and roche commands, with --json.

def _sel_args(sel: dict[str, Any]) -> list[str]:
    return ["--tag", sel["tag"]] if "tag" in sel else [str(sel["pid"])]


def start_args(sandbox_id: str, req: CommandRequest) -> list[str]:
    a = ["exec", "--sandbox", sandbox_id, "--background", "--json"]
    if req.timeout:
        a += ["--timeout", repr(req.timeout)]
    for k, v in req.envs.items():
        a += ["--env", f"{k}={v}"]
    if req.cwd:
        a += ["--workdir", req.cwd]
    if req.tag:
        a += ["--tag", req.tag]
    if req.stdin:
        a.append("--keep-stdin")
    if req.window:
        a += ["--window", str(req.window)]
    if req.key:
        a += ["--idempotency-key", req.key]
    return a + ["--", *req.argv]


def connect_args(sandbox_id: str, sel: dict[str, Any], stdout_offset: int, stderr_offset: int) -> list[str]:
    return ["commands", "connect", "--sandbox", sandbox_id, "--json", "--stdout-offset", str(stdout_offset),
            "--stderr-offset", str(stderr_offset), *_sel_args(sel)]


def list_args(sandbox_id: str) -> list[str]:
    return ["commands", "list", "--sandbox", sandbox_id, "--json"]


def send_args(sandbox_id: str, sel: dict[str, Any]) -> list[str]:
    return ["commands", "send-stdin", "--sandbox", sandbox_id, *_sel_args(sel)]


def close_args(sandbox_id: str, sel: dict[str, Any]) -> list[str]:
    return ["commands", "close-stdin", "--sandbox", sandbox_id, *_sel_args(sel)]


def signal_args(sandbox_id: str, sel: dict[str, Any], sig: int) -> list[str]:
    return ["commands", "signal", "--sandbox", sandbox_id, *_sel_args(sel), str(sig)]


def _cli_end(m: dict[str, Any]) -> Ended:
    return Ended(exit_code=int(m.get("exit_code", 0)), signal=int(m.get("signal", 0)), timed_out=bool(m.get("timed_out")),
                 oom_killed=bool(m.get("oom_killed")), duration=_int(m.get("duration_ns")) / 1e9,
                 unknown=str(m.get("unknown", "")))


def parse_cli_command(m: Any) -> CommandInfo:
    """A command as `roche exec --background --json` and `roche commands list --json`
    print it (Go's field names)."""
    if not isinstance(m, dict):
        raise RocheError(f"the roche CLI printed {m!r} where a command was expected")
    end = m.get("end") if isinstance(m.get("end"), dict) else None
    first, written = m.get("first") or {}, m.get("written") or {}
    return CommandInfo(
        pid=int(m.get("pid", 0)), tag=m.get("tag") or None, argv=tuple(m.get("cmd") or ()), envs=dict(m.get("env") or {}),
        cwd=str(m.get("workdir", "")), running=bool(m.get("running")), stdin=bool(m.get("stdin")), pty=bool(m.get("tty")),
        started_at=parse_time(m.get("started_at")), window=_int(m.get("window")),
        first_stdout=_int(first.get("stdout")), first_stderr=_int(first.get("stderr")),
        stdout_bytes=_int(written.get("stdout")), stderr_bytes=_int(written.get("stderr")),
        exit_code=None if end is None else int(end.get("exit_code", 0)),
        signal=0 if end is None else int(end.get("signal", 0)),
        unknown="" if end is None else str(end.get("unknown", "")),
    )


def cli_event(line: bytes) -> Optional[Event]:
    """One line of `roche commands connect --json`."""
    try:
        m = json.loads(line)
    except ValueError:
        raise RocheError(f"the roche CLI printed {line[:200]!r} where a command's event was expected") from None
    if not isinstance(m, dict):
        return None
    if "start" in m:
        s = m["start"]
        return Started(int(s.get("pid", 0)), s.get("tag") or None, _int(s.get("stdout_offset")), _int(s.get("stderr_offset")))
    if "stream" in m:
        stream: Stream = "stderr" if m["stream"] == "stderr" else "stdout"
        return Data(stream, _int(m.get("offset")), base64.b64decode(m.get("data") or ""))
    if "end" in m:
        return _cli_end(m["end"])
    return None


def retryable(e: BaseException) -> bool:
    """Whether a connection to a command failed in a way a new one may not: the
    connection to roched broke or roched is restarting, as opposed to an answer (the
    command or the sandbox is not there, the offset fell out of the window)."""
    if isinstance(e, TLSFailure):
        return False
    if isinstance(e, ProviderUnavailable):
        return True
    return type(e) is RocheError and not e.reason
