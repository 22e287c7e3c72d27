"""The values the SDK hands back: results, output events, sandbox, snapshot and workspace
descriptions, mounts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

from .errors import InvalidConfig

#: The image used when create() is given none and ROCHE_IMAGE is unset (as the CLI's).
DEFAULT_IMAGE = "python:3.12-slim"
#: Each stream's output is kept up to this many bytes, then truncated and flagged.
DEFAULT_OUTPUT_LIMIT = 10 << 20

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class Receipt:
    """What a command used, measured by roche-agent in the sandbox (None on a result
    where the provider cannot measure: wasm, Docker's exec fallback)."""

    #: The largest resident set of any process of the command's tree (ru_maxrss).
    peak_memory_bytes: int = 0
    #: Seconds of CPU (user plus system) the command's tree used.
    cpu_time: float = 0.0
    #: Processes of its process group still running in the sandbox when it exited.
    leftover_processes: int = 0
    #: Why the command ended or was cut when something other than the command did:
    #: "command_timeout", "oom", "output_cap"; "" when it ended on its own.
    #: ``evidence`` is what it was read from (docs/ended.md).
    end: str = ""
    evidence: str = ""


@dataclass(frozen=True)
class EndReason:
    """Why and when a sandbox ended, with the evidence it was read from (see
    docs/ended.md). ``kind`` is one of: oom, pids, lifetime, command_timeout,
    output_cap, lease_lost, destroyed, engine_gone, agent_exited, unknown."""

    kind: str
    at: Optional[datetime] = None
    detail: str = ""
    #: What the reason was read from, e.g. the cgroup's memory.events oom_kill.
    evidence: str = ""
    #: Who destroyed it: "tenant:NAME", or a direct-mode sandbox's owner.
    by: str = ""
    #: The sandbox's main process's exit status, when known.
    exit_code: Optional[int] = None


@dataclass(frozen=True)
class ExecResult:
    """The outcome of a command. A non-zero exit, a timeout or an OOM kill are results."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False
    #: Seconds the command ran.
    duration: float = 0.0
    #: What it used (peak memory, CPU time, processes left running); None where the
    #: provider cannot measure it.
    receipt: Optional[Receipt] = None

    @property
    def ok(self) -> bool:
        """The command exited 0 without timing out."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class OutputEvent:
    """A piece of output, as the command produced it."""

    stream: Stream
    data: bytes
    #: ``data`` decoded as UTF-8; characters split across events are decoded whole.
    text: str
    #: For a command's output (``sandbox.commands``): the byte offset of ``data`` in its
    #: stream, counted from the command's start; the next piece starts at offset +
    #: len(data). 0 for exec_stream's.
    offset: int = 0


@dataclass(frozen=True)
class CommandResult:
    """How a command of ``sandbox.commands`` ended, with its output as this SDK received
    it (each stream up to 64 MiB, then ``truncated``). A non-zero exit, a timeout or an
    OOM kill are results, not exceptions. When the exit status cannot be known (the
    sandbox stopped under the command: destroyed, its lifetime over, its lease lost),
    ``exit_code`` is -1 and ``unknown`` says why: a status is never made up."""

    stdout: str
    stderr: str
    exit_code: int
    pid: int = 0
    #: The signal that killed it (``exit_code`` is then 128 + signal); 0 when it exited.
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    #: Seconds the command ran.
    duration: float = 0.0
    unknown: str = ""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """The command exited 0 without timing out."""
        return self.exit_code == 0 and not self.timed_out and not self.unknown

    @property
    def error(self) -> Optional[str]:
        """E2B's name: why the command did not succeed (its exit, its signal, or why its
        status is unknown), None when it did."""
        if self.unknown:
            return self.unknown
        if self.timed_out:
            return f"the command timed out after {self.duration:.3g} s and was killed"
        if self.signal:
            return f"killed by signal {self.signal}"
        if self.exit_code:
            return f"exit status {self.exit_code}"
        return None


@dataclass(frozen=True)
class CommandInfo:
    """A command of ``sandbox.commands.list()``, running or ended (E2B's ProcessInfo:
    ``pid``, ``tag``, ``cmd``, ``args``, ``envs``, ``cwd``)."""

    pid: int
    tag: Optional[str]
    #: The argv it was started with (a shell line is ["/bin/sh", "-c", ..., "sh", LINE]).
    argv: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    running: bool = False
    #: Its stdin is open for send_stdin.
    stdin: bool = False
    #: A terminal session (``sandbox.pty``).
    pty: bool = False
    started_at: Optional[datetime] = None
    #: The output kept per stream, and the offsets of the first byte still kept and of
    #: the next byte (each stream's length so far).
    window: int = 0
    first_stdout: int = 0
    first_stderr: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: Once it has ended: its exit status (-1 when unknown), signal and why unknown.
    exit_code: Optional[int] = None
    signal: int = 0
    unknown: str = ""

    @property
    def cmd(self) -> str:
        """E2B's name: the program (argv[0])."""
        return self.argv[0] if self.argv else ""

    @property
    def args(self) -> tuple[str, ...]:
        """E2B's name: the arguments after the program."""
        return self.argv[1:]


@dataclass(frozen=True)
class SandboxInfo:
    """Describes a sandbox."""

    id: str
    provider: str
    image: str
    state: str
    created_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    #: Who made it: "roched:INSTANCE/TENANT" through roched, "cli:USER@HOST" directly.
    owner: str = ""
    #: Why it ended, for one that did (``Roche.inspect`` of a sandbox that ended within
    #: roched's --ended-retention); None while it runs.
    end: Optional[EndReason] = None
    #: The key/value labels it was created with (``create(metadata=...)``).
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot: a sandbox's saved files (process memory is not kept)."""

    name: str
    provider: str
    #: The image the snapshotted sandbox was made from.
    image: str
    created_at: Optional[datetime] = None


@dataclass(frozen=True)
class EgressDecision:
    """One connection (a CONNECT tunnel or a plain HTTP request) a sandbox asked its
    egress proxy for, and what the proxy did with it (``sandbox.egress_log()``)."""

    #: Numbers the proxy's decisions from 1.
    seq: int
    time: Optional[datetime]
    sandbox: str
    tenant: str
    host: str
    port: int
    #: The address resolved (and dialled when allowed).
    addr: str
    #: CONNECT, or the plain HTTP request's method; ``path`` is a plain request's.
    method: str
    path: str
    #: The entry that allowed it, or that would have allowed a refusal for want of one.
    rule: str
    allowed: bool
    #: What the sandbox was told.
    reason: str
    #: Bytes to and from the upstream, filled in when an allowed connection ends (done).
    bytes_out: int
    bytes_in: int
    done: bool


@dataclass(frozen=True)
class StoredSecret:
    """A secret in roched's secret store (``roche.list_secrets()``): never its value."""

    name: str
    #: When it was last set.
    updated: Optional[datetime]
    #: The running sandboxes that took it from the store (a ``set_secret`` rotates them).
    sandboxes: "list[str]"


@dataclass(frozen=True)
class WorkspaceInfo:
    """A persistent workspace, mounted at /workspace by the sandboxes created with it."""

    name: str
    provider: str
    created_at: Optional[datetime] = None
    #: The ids of the live sandboxes that have it mounted.
    in_use_by: tuple[str, ...] = ()
    #: What it may hold, in bytes, fixed when it was made; 0 for one made before
    #: workspaces had sizes.
    size_bytes: int = 0


@dataclass(frozen=True)
class Mount:
    """Binds a host path into the sandbox, read-only unless ``read_write``."""

    source: str
    target: str
    read_write: bool = False

    @classmethod
    def parse(cls, spec: str) -> "Mount":
        """Parses the CLI's ``HOST:SANDBOX[:ro|rw]``."""
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise InvalidConfig(f"mount {spec!r}: use HOST_PATH:SANDBOX_PATH[:ro|rw]")
        if len(parts) == 3 and parts[2] not in ("ro", "rw"):
            raise InvalidConfig(f"mount {spec!r}: mode {parts[2]!r} is neither ro nor rw")
        return cls(parts[0], parts[1], len(parts) == 3 and parts[2] == "rw")

    def __str__(self) -> str:
        return f"{self.source}:{self.target}:{'rw' if self.read_write else 'ro'}"


MountLike = Union[Mount, str]


@dataclass(frozen=True)
class Secret:
    """A credential the egress proxy brokers (``create(secrets=[...])``): the sandbox's
    environment variable ``name`` holds a placeholder, which the proxy replaces by the
    value in the headers of requests to ``hosts`` (HOST[:PORT], 443 by default) only,
    and only in ``header`` if given. Give ``value``, or ``from_store=True`` to take it
    from roched's secret store (``roche secret set NAME``), whose rotation the sandbox
    then follows. Needs roched and a ``network_allowlist`` allowing the hosts."""

    name: str
    hosts: Sequence[str]
    value: Optional[str] = field(default=None, repr=False)
    header: Optional[str] = None
    from_store: bool = False


@dataclass(frozen=True)
class SandboxConfig:
    """What to create, with the secure defaults; workdir and user None mean the image's and Roche's."""

    image: str
    network: bool = False
    writable: bool = False
    timeout_secs: int = 300
    memory: str = "512m"
    cpus: float = 1.0
    pids_limit: int = 64
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    workdir: Optional[str] = None
    user: Optional[str] = None
    network_allowlist: Sequence[str] = ()
    #: A persistent workspace mounted at /workspace, made if new; it outlives the sandbox.
    workspace: Optional[str] = None
    #: Create from this snapshot's files instead of the image.
    from_snapshot: Optional[str] = None
    #: What a writable root may hold ("1g", "100m"; "0" is no limit).
    disk: str = "1g"
    #: The size of a new workspace; None leaves it to the workspace (1g for a new one).
    workspace_size: Optional[str] = None
    #: Tied to this process: destroyed within seconds of its end, however it ends.
    leased: bool = True
    #: Key/value labels kept with the sandbox; ``list(metadata=...)`` selects on them.
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: Credentials the egress proxy brokers (see Secret).
    secrets: Sequence[Secret] = ()
    #: Learn mode: roched keeps every allowlist entry the refusals needed (egress_suggest).
    egress_learn: bool = False


def _size(what: str, v: Union[str, int]) -> str:
    """A size as Roche takes it: a string such as "1g", or a number of bytes."""
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise InvalidConfig(f"{what} {v!r}: give a size such as '1g' or a number of bytes")
    return str(v)


def make_config(
    image: Optional[str],
    network: bool,
    writable: bool,
    timeout_secs: int,
    memory: Union[str, int],
    cpus: float,
    pids_limit: int,
    env: Optional[Mapping[str, str]],
    mounts: Optional[Sequence[MountLike]],
    workdir: Optional[str],
    user: Optional[str],
    network_allowlist: Optional[Sequence[str]] = None,
    workspace: Optional[str] = None,
    from_snapshot: Optional[str] = None,
    disk: Union[str, int] = "1g",
    workspace_size: Union[str, int, None] = None,
    leased: bool = True,
    metadata: Optional[Mapping[str, str]] = None,
    secrets: Optional[Sequence[Secret]] = None,
    egress_learn: bool = False,
) -> SandboxConfig:
    """Builds a config from create()'s arguments. Roche itself validates the values."""
    if image is None:
        image = os.environ.get("ROCHE_IMAGE") or DEFAULT_IMAGE
    ms: list[Mount] = []
    for m in mounts or ():
        if isinstance(m, Mount):
            ms.append(m)
        elif isinstance(m, str):
            ms.append(Mount.parse(m))
        else:
            raise InvalidConfig(f"mount {m!r}: give a Mount or a 'HOST:SANDBOX[:ro|rw]' string")
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidConfig(f"env {k!r}={v!r}: names and values must be strings")
    check_metadata(metadata)
    for sec in secrets or ():
        if not isinstance(sec, Secret):
            raise InvalidConfig(f"secret {sec!r}: give a Secret(name, hosts, value=... or from_store=True)")
        if isinstance(sec.hosts, str):
            raise InvalidConfig(f"secret {sec.name}: hosts is a list of HOST[:PORT], not one string")
    for what, name in (("workspace", workspace), ("from_snapshot", from_snapshot)):
        if name is not None and not isinstance(name, str):
            raise InvalidConfig(f"{what} {name!r}: give a name, e.g. 'proj'")
    return SandboxConfig(
        image=image,
        network=bool(network),
        writable=bool(writable),
        timeout_secs=int(timeout_secs),
        memory=str(memory),
        cpus=float(cpus),
        pids_limit=int(pids_limit),
        env=dict(env or {}),
        mounts=tuple(ms),
        workdir=workdir,
        user=user,
        network_allowlist=tuple(network_allowlist or ()),
        workspace=workspace or None,
        from_snapshot=from_snapshot or None,
        disk=_size("disk", disk),
        workspace_size=None if workspace_size is None else _size("workspace_size", workspace_size),
        leased=bool(leased),
        metadata=dict(metadata or {}),
        secrets=tuple(secrets or ()),
        egress_learn=bool(egress_learn),
    )


def check_metadata(metadata: Optional[Mapping[str, str]]) -> None:
    """Metadata must be a mapping of strings to strings; Roche checks the rest (key
    charset, sizes, no key of Roche's own) and says what is wrong."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise InvalidConfig(f"metadata {metadata!r}: give a dict of strings, e.g. {{'user': 'alice'}}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidConfig(f"metadata {k!r}={v!r}: keys and values must be strings")


_LIST_STATES = ("running", "paused", "exited", "created")


def check_list_filter(metadata: Optional[Mapping[str, str]], state: Optional[str]) -> None:
    """list()'s filter: metadata as for create, state one of _LIST_STATES."""
    check_metadata(metadata)
    if state is not None and state not in _LIST_STATES:
        raise InvalidConfig(f"state {state!r}: give one of {', '.join(_LIST_STATES)}")


def timeout_seconds(seconds: Union[int, float]) -> int:
    """set_timeout()'s lifetime, in whole seconds (rounded up), at least 1."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 1:
        raise InvalidConfig(f"timeout {seconds!r}: give a number of seconds, at least 1")
    return int(-(-seconds // 1))


@dataclass(frozen=True)
class ExecRequest:
    """A command to run; built by Sandbox.exec."""

    cmd: Sequence[str]
    timeout: Optional[float] = None
    stdin: Optional[bytes] = None
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: Optional[str] = None
    #: Makes the command the sandbox's (exec's ``idempotency_key``): a retry joins it.
    idempotency_key: Optional[str] = None


def make_exec_request(
    cmd: Sequence[str],
    timeout: Optional[float],
    stdin: Union[bytes, str, None],
    env: Optional[Mapping[str, str]],
    workdir: Optional[str],
) -> ExecRequest:
    """Checks exec()'s arguments, so that a mistake fails here with a hint."""
    if isinstance(cmd, (str, bytes)):
        raise InvalidConfig(
            f"cmd {cmd!r} is a string: give the program and its arguments as a list, "
            f"e.g. ['python3', '-c', 'print(1)'] or ['sh', '-c', {cmd!r}]"
        )
    argv = list(cmd)
    if not argv:
        raise InvalidConfig("empty command: give the program and its arguments, e.g. ['python3', '-c', 'print(1)']")
    if not all(isinstance(a, str) for a in argv):
        raise InvalidConfig(f"cmd {argv!r}: every argument must be a string")
    if timeout is not None and timeout <= 0:
        raise InvalidConfig(f"timeout {timeout!r}: give seconds > 0, or None for the sandbox's lifetime")
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return ExecRequest(argv, None if timeout is None else float(timeout), data, dict(env or {}), workdir)


#: The most file content one copy or read moves unless the caller passes max_bytes, as
#: the CLI's and the Go API's (roche.DefaultCopyMaxBytes).
DEFAULT_COPY_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class SkippedEntry:
    """An entry a copy left out: ``reason`` is "symlink" (links were not asked for),
    "outside" (a link pointing outside the destination) or "special" (a device, fifo,
    socket or hard link). ``path`` is where it was in the source."""

    path: str
    target: str
    reason: str


@dataclass(frozen=True)
class CopyReport:
    """What copy_to or copy_from moved and what it left out (``skipped``, of which
    ``skipped_links`` were symlinks; ``examples`` are the first few)."""

    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    skipped: int = 0
    skipped_links: int = 0
    examples: tuple[SkippedEntry, ...] = ()

    @property
    def note(self) -> str:
        """A one-line account of what was left out, or "" when nothing was."""
        if not self.skipped:
            return ""
        shown = ", ".join(f"{e.path} -> {e.target}" if e.target else e.path for e in self.examples)
        if self.skipped > len(self.examples):
            shown += ", ..."
        why = []
        if self.skipped_links:
            why.append("symlinks are copied out only when asked (preserve_links=True) and only if they point inside the destination")
        if self.skipped > self.skipped_links:
            why.append("devices, fifos, sockets and hard links are not copied")
        n = self.skipped
        what = "entry" if n == 1 else "entries"
        if self.skipped_links == n:
            what = "symlink" if n == 1 else "symlinks"
        elif not self.skipped_links:
            what = "special file" if n == 1 else "special files"
        return f"skipped {n} {what} ({shown}): {'; '.join(why)}"


#: Code languages a context can run, where the sandbox's image has the interpreter.
LANGUAGES = ("python", "bash", "javascript")
#: How long run_code lets a cell run when given no timeout (roche.DefaultCodeTimeout).
DEFAULT_CODE_TIMEOUT = 300.0


@dataclass(frozen=True)
class OutputMessage:
    """A piece of a cell's output, for run_code's on_stdout and on_stderr (E2B's name)."""

    line: str
    #: When it arrived, in nanoseconds since the epoch.
    timestamp: int
    #: It came from stderr.
    error: bool = False

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class ExecutionError:
    """The exception that ended a cell: e.g. name "ZeroDivisionError", value "division by
    zero", and the formatted traceback. A cell interrupted at its timeout ends in
    "KeyboardInterrupt"."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Result:
    """One rich result of a cell: a display call, a figure, or the value of the last
    expression (``is_main_result``). Each form is set when the result has it; ``png``
    and ``jpeg`` are base64 text, as E2B's."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    latex: Optional[str] = None
    #: application/json, parsed.
    json: Optional[object] = None
    javascript: Optional[str] = None
    is_main_result: bool = False

    def formats(self) -> list[str]:
        """The forms this result has, E2B's names: "text", "html", "png", ..."""
        names = ("text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript")
        return [n for n in names if getattr(self, n) is not None]

    def __repr__(self) -> str:
        if self.text:
            return f"Result({self.text})"
        return f"Result(Formats: {', '.join(self.formats())})"


@dataclass(frozen=True)
class Logs:
    """What a cell printed, in the pieces it was printed in."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Execution:
    """The outcome of a cell, shaped like E2B's. An exception, a timeout or a dead
    interpreter are in ``error`` (and ``timed_out``, ``restarted``), not raised."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    #: The cells the context has run, this one included.
    execution_count: Optional[int] = None
    #: The id of the context that ran the cell.
    context: str = ""
    #: The cell was interrupted at its timeout; the context keeps its variables.
    timed_out: bool = False
    #: The context's interpreter had died (os._exit, the memory limit): a fresh one,
    #: without the old variables, ran this cell.
    restarted: bool = False
    #: A log stream passed the output limit and was cut.
    truncated: bool = False
    #: Seconds the cell ran.
    duration: float = 0.0

    @property
    def text(self) -> Optional[str]:
        """The value of the cell's last expression, as text (None when there is none)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass(frozen=True)
class Context:
    """A code context: a long-lived interpreter in the sandbox that keeps its variables."""

    id: str
    language: str
    cwd: str = ""
    #: The language's default context, which run_code uses when given none.
    default: bool = False


ContextLike = Union[Context, str]


@dataclass(frozen=True)
class CodeRequest:
    """A cell to run; built by Sandbox.run_code."""

    code: str
    language: str = ""
    context: str = ""
    timeout: Optional[float] = None


def context_id(ctx: Optional[ContextLike]) -> str:
    """The id of a Context or of an id, "" for None."""
    if ctx is None:
        return ""
    if isinstance(ctx, Context):
        return ctx.id
    if isinstance(ctx, str) and ctx:
        return ctx
    raise InvalidConfig(f"context {ctx!r}: give a Context (from create_code_context) or its id")


def make_code_request(code: str, language: Optional[str], context: Optional[ContextLike],
                      timeout: Optional[float]) -> CodeRequest:
    """Checks run_code's arguments, so that a mistake fails here with a hint."""
    if not isinstance(code, str):
        raise InvalidConfig(f"code {code!r}: give the source as a string")
    lang = language or ""
    if lang and lang not in LANGUAGES:
        raise InvalidConfig(f"language {language!r}: choose one of {', '.join(LANGUAGES)}")
    if timeout is not None and (isinstance(timeout, bool) or timeout <= 0):
        raise InvalidConfig(f"timeout {timeout!r}: give seconds > 0, or None for {DEFAULT_CODE_TIMEOUT:g}")
    cid = context_id(context)
    if isinstance(context, Context) and lang and lang != context.language:
        raise InvalidConfig(f"language {lang!r} differs from the context's ({context.language!r}): give one or the other")
    return CodeRequest(code, lang, cid, None if timeout is None else float(timeout))


#: A run_code callback; the async API also awaits one that returns an awaitable.
Handler = Callable[[Any], Any]


class CodeCallbacks:
    """Which of run_code's callbacks each item of a cell's stream calls, so that a result
    reaches on_result once whether it came as produced or only in the execution."""

    def __init__(self, on_stdout: Optional[Handler], on_stderr: Optional[Handler],
                 on_result: Optional[Handler], on_error: Optional[Handler]) -> None:
        self._out, self._err, self._result, self._error = on_stdout, on_stderr, on_result, on_error
        self._seen = 0

    def calls(self, item: object) -> list[tuple[Handler, object]]:
        if isinstance(item, OutputMessage):
            h = self._err if item.error else self._out
            return [(h, item)] if h else []
        if isinstance(item, Result):
            self._seen += 1
            return [(self._result, item)] if self._result else []
        if isinstance(item, Execution):
            late = item.results[self._seen:]
            self._seen = len(item.results)
            out: list[tuple[Handler, object]] = [(self._result, r) for r in late] if self._result else []
            if item.error is not None and self._error:
                out.append((self._error, item.error))
            return out
        return []
