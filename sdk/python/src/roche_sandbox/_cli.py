"""The roche CLI as a transport: the arguments for each call and how to read what it
prints (--json objects, its one-line errors, its closing lines after streamed output).
No I/O here; the sync and async transports share it."""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Mapping, Optional

from ._wire import CodeAssembler, CodeItem, OutputAssembler, decode_output, parse_context, parse_execution, parse_time
from .errors import InvalidConfig, ProviderUnavailable, RocheError, error_for, reason_from_text
from .types import CodeRequest, Context, CopyReport, EndReason, ExecRequest, ExecResult, Receipt, SkippedEntry, OutputEvent, SandboxConfig, SandboxInfo, SnapshotInfo, Stream, WorkspaceInfo

#: The CLI's exit statuses besides the command's own (internal/cli).
EXIT_TIMEOUT, EXIT_ROCHE_FAILED = 124, 125
#: The exit code of a command killed at its timeout, as every provider reports it.
EXIT_KILLED = 137


def create_args(provider: str, cfg: SandboxConfig) -> list[str]:
    a = ["create", "--json", "--provider", provider, "--image", cfg.image, "--memory", cfg.memory, "--disk", cfg.disk,
         "--cpus", repr(cfg.cpus), "--timeout", str(cfg.timeout_secs), "--pids-limit", str(cfg.pids_limit)]
    if cfg.network:
        a.append("--network")
    if cfg.writable:
        a.append("--writable")
    for k, v in cfg.env.items():
        a += ["--env", f"{k}={v}"]
    for m in cfg.mounts:
        a += ["--mount", str(m)]
    if cfg.workdir:
        a += ["--workdir", cfg.workdir]
    if cfg.user:
        a += ["--user", cfg.user]
    for h in cfg.network_allowlist:
        a += ["--allow-host", h]
    if cfg.workspace:
        a += ["--workspace", cfg.workspace]
    if cfg.from_snapshot:
        a += ["--from-snapshot", cfg.from_snapshot]
    if cfg.workspace_size is not None:
        a += ["--workspace-size", cfg.workspace_size]
    for k, v in cfg.metadata.items():
        a += ["--metadata", f"{k}={v}"]
    for sec in cfg.secrets:
        if not sec.from_store:
            # Never a value on a command line: the CLI takes one from a file only.
            raise InvalidConfig(f"secret {sec.name}: a secret with a value needs roched (the daemon transport)")
        a += ["--secret", sec.name] + [x for h in sec.hosts for x in ("--secret-host", f"{sec.name}={h}")]
        if sec.header:
            a += ["--secret-header", f"{sec.name}={sec.header}"]
    if cfg.egress_learn:
        a.append("--egress-learn")
    if cfg.leased:
        a.append("--hold")  # roche stays, holding the sandbox until its stdin closes (_lease.CLIHold)
    return a


def cp_args(src: str, dst: str, max_bytes: Optional[int], preserve_links: bool) -> list[str]:
    """`roche cp --json -T`, which prints what it copied and left out; dst is the new name
    even when it is a directory (-T), as the SDK's copies are."""
    a = ["cp", "--json", "-T"]
    if max_bytes:
        a += ["--max-bytes", str(max_bytes)]
    if preserve_links:
        a.append("--preserve-links")
    return a + [src, dst]


def parse_copy_report(out: bytes) -> CopyReport:
    """What `roche cp --json` printed."""
    obj = parse_json(out, "cp")
    if not isinstance(obj, dict):
        raise RocheError(f"the roche CLI printed {obj!r} where a copy report was expected")
    examples = tuple(SkippedEntry(str(e.get("path", "")), str(e.get("target", "")), str(e.get("reason", "")))
                     for e in obj.get("skipped_examples") or () if isinstance(e, dict))
    return CopyReport(int(obj.get("files", 0)), int(obj.get("dirs", 0)), int(obj.get("links", 0)),
                      int(obj.get("bytes", 0)), int(obj.get("skipped", 0)), int(obj.get("skipped_links", 0)), examples)


def reset_args(sandbox_id: str, keep_workspace: bool) -> list[str]:
    a = ["reset", "--json", sandbox_id]
    if not keep_workspace:
        a.append("--wipe-workspace")
    return a


def snapshot_args(provider: str, sandbox_id: str, name: str) -> list[str]:
    return ["snapshot", "create", "--json", "--provider", provider, sandbox_id, name]


def exec_args(sandbox_id: str, req: ExecRequest, as_json: bool) -> list[str]:
    a = ["exec", "--sandbox", sandbox_id]
    if as_json:
        a.append("--json")
    if req.timeout:
        a += ["--timeout", repr(req.timeout)]
    if req.stdin is not None:
        a.append("--interactive")
    for k, v in req.env.items():
        a += ["--env", f"{k}={v}"]
    if req.workdir:
        a += ["--workdir", req.workdir]
    if req.idempotency_key is not None:
        a += ["--idempotency-key", req.idempotency_key]
    return a + ["--", *req.cmd]


def parse_info(obj: Any) -> SandboxInfo:
    """A sandbox as `roche create --json` and `roche list --json` print it."""
    if not isinstance(obj, dict):
        raise RocheError(f"the roche CLI printed {obj!r} where a sandbox was expected")
    return SandboxInfo(
        id=str(obj.get("id", "")),
        provider=str(obj.get("provider", "")),
        image=str(obj.get("image", "")),
        state=str(obj.get("state", "")),
        created_at=parse_time(obj.get("created_at")),
        expires_at=parse_time(obj.get("expires_at")),
        owner=str(obj.get("owner", "")),
        metadata={str(k): str(v) for k, v in (obj.get("metadata") or {}).items()},
        end=parse_end(obj.get("end")),
    )


def parse_end(obj: Any) -> Optional[EndReason]:
    """Why a sandbox ended, as `roche inspect --json` prints it under "end"."""
    if not isinstance(obj, dict):
        return None
    return EndReason(
        kind=str(obj.get("kind", "unknown")),
        at=parse_time(obj.get("at")),
        detail=str(obj.get("detail", "")),
        evidence=str(obj.get("evidence", "")),
        by=str(obj.get("by", "")),
        exit_code=int(obj.get("exit_code", 0)) if obj.get("exit_known") else None,
    )


def list_args(provider: str, metadata: Optional[Mapping[str, str]], state: Optional[str]) -> list[str]:
    """`roche list --json` of the sandboxes with every metadata pair and the state."""
    a = ["list", "--json", "--provider", provider]
    for k, v in (metadata or {}).items():
        a += ["--metadata", f"{k}={v}"]
    if state:
        a += ["--state", state]
    return a


def parse_snapshot(obj: Any) -> SnapshotInfo:
    """A snapshot as `roche snapshot create|list --json` prints it."""
    if not isinstance(obj, dict):
        raise RocheError(f"the roche CLI printed {obj!r} where a snapshot was expected")
    return SnapshotInfo(
        name=str(obj.get("name", "")),
        provider=str(obj.get("provider", "")),
        image=str(obj.get("image", "")),
        created_at=parse_time(obj.get("created_at")),
    )


def parse_workspace(obj: Any) -> WorkspaceInfo:
    """A workspace as `roche workspace list --json` prints it."""
    if not isinstance(obj, dict):
        raise RocheError(f"the roche CLI printed {obj!r} where a workspace was expected")
    return WorkspaceInfo(
        name=str(obj.get("name", "")),
        provider=str(obj.get("provider", "")),
        created_at=parse_time(obj.get("created_at")),
        in_use_by=tuple(str(i) for i in obj.get("in_use_by") or ()),
        size_bytes=int(obj.get("size_bytes") or 0),
    )


def parse_json(out: bytes, what: str) -> Any:
    try:
        return json.loads(out)
    except ValueError:
        raise RocheError(f"the roche CLI printed no JSON for {what}: {decode_output(out[:200])!r}") from None


def parse_exec(obj: Any) -> ExecResult:
    """A result as `roche exec --json` prints it."""
    if not isinstance(obj, dict):
        raise RocheError(f"the roche CLI printed {obj!r} where an exec result was expected")
    return ExecResult(
        stdout=str(obj.get("stdout", "")),
        stderr=str(obj.get("stderr", "")),
        exit_code=int(obj.get("exit_code", 0)),
        timed_out=bool(obj.get("timed_out", False)),
        truncated=bool(obj.get("truncated", False)),
        oom_killed=bool(obj.get("oom_killed", False)),
        duration=int(obj.get("duration_ns", 0)) / 1e9,
        receipt=parse_receipt(obj.get("receipt")),
    )


def parse_receipt(obj: Any) -> Optional[Receipt]:
    """A command's receipt as `roche exec --json` prints it, None for none."""
    if not isinstance(obj, dict):
        return None
    return Receipt(
        peak_memory_bytes=int(obj.get("peak_memory_bytes", 0)),
        cpu_time=int(obj.get("cpu_time_ns", 0)) / 1e9,
        leftover_processes=int(obj.get("leftover_processes", 0)),
        end=str(obj.get("end", "")),
        evidence=str(obj.get("evidence", "")),
    )


_PREFIX = b"roche: "


def error_from_stderr(stderr: bytes, rc: int, verb: str) -> RocheError:
    """The typed exception for the CLI's one-line error: with --json, the object
    {"error": {"reason": ..., "message": ..., "retry_after_ms": ...}}, whose reason
    decides the class; otherwise "roche: MESSAGE", whose sentinel text does."""
    lines = decode_output(stderr).splitlines()
    for line in reversed(lines):
        if line.startswith('{"error":'):
            try:
                body = json.loads(line)["error"]
                after = body.get("retry_after_ms")
                retry_after = after / 1000 if isinstance(after, int) and not isinstance(after, bool) and after > 0 else None
                return error_for(str(body.get("reason", "")), str(body["message"]), retry_after)
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        if line.startswith("roche: "):
            # "(see --help)" is for people at a terminal, not for SDK users.
            message = line[len("roche: "):].removesuffix(" (see --help)")
            return error_for(reason_from_text(message), message)
    tail = " | ".join(lines[-3:]) or "no message"
    return RocheError(f"roche {verb} exited with status {rc}: {tail}")


_TRUNCATED = re.compile(rb"^roche: output truncated: a stream passed \d+ bytes$")
_OOM = re.compile(rb"^roche: the command was killed for exceeding the sandbox's memory limit \(raise it with --memory\)$")
# The CLI names the limit that killed it (internal/cli's timedOut): the command's own
# timeout, or the sandbox's lifetime.
_TIMED_OUT = re.compile(
    rb"^roche: the command (timed out: \S+ \S+ killed it after it ran \S+"
    rb"|was killed when the sandbox's lifetime ended \(.*\))$"
)


class StreamParser:
    """Reads a streaming `roche exec`: stdout and stderr pieces become events as they
    come, except stderr lines that start with "roche: ", which are held back until it is
    clear whether they are the command's or roche's closing lines (truncated, OOM killed,
    timed out, or an error), which the CLI prints last."""

    def __init__(self) -> None:
        self.out = OutputAssembler()
        self._held = bytearray()
        self._at_line_start = True  # whether held[0] (or the next stderr byte) starts a line

    def feed(self, stream: Stream, data: bytes) -> list[OutputEvent]:
        if not data:
            return []
        if stream == "stdout":
            return [self.out.output("stdout", data)]
        buf = self._held + data
        cut = _held_suffix(buf, self._at_line_start)
        emit = bytes(buf[:cut])
        self._held = bytearray(buf[cut:])
        if emit:
            self._at_line_start = emit.endswith(b"\n")
            return [self.out.output("stderr", emit)]
        return []

    def finish(self, rc: int, duration: float) -> tuple[list[OutputEvent], ExecResult]:
        """The remaining events and the result, once the CLI exited with rc; raises the
        CLI's error when roche itself failed."""
        lines = bytes(self._held).splitlines(keepends=True)
        if rc == EXIT_ROCHE_FAILED and lines and lines[-1].startswith(_PREFIX) and lines[-1].endswith(b"\n"):
            last = lines[-1].rstrip(b"\n")
            if not (_TRUNCATED.match(last) or _OOM.match(last) or _TIMED_OUT.match(last)):
                raise error_from_stderr(last, rc, "exec")
        truncated = oom = timed_out = False
        rest = bytearray()
        for line in lines:
            bare = line.rstrip(b"\n")
            if _TRUNCATED.match(bare):
                truncated = True
            elif _OOM.match(bare):
                oom = True
            elif rc == EXIT_TIMEOUT and _TIMED_OUT.match(bare):
                timed_out = True
            else:
                rest += line
        events = [self.out.output("stderr", bytes(rest))] if rest else []
        result = ExecResult("", "", EXIT_KILLED if timed_out else rc, timed_out, truncated, oom, duration)
        return events, self.out.result(result)


def _qualifies(line: bytes, complete: bool) -> bool:
    if line.startswith(_PREFIX):
        return True
    return not complete and _PREFIX.startswith(line)


def _held_suffix(buf: bytearray, at_line_start: bool) -> int:
    """Where the suffix of buf made only of lines that may be roche's own begins."""
    cut = len(buf)
    while cut > 0:
        start = buf.rfind(b"\n", 0, cut - 1) + 1
        if start == 0 and not at_line_start:
            break
        line = bytes(buf[start:cut])
        if not _qualifies(line, line.endswith(b"\n")):
            break
        cut = start
    return cut


def result_or_error(out: bytes, err: bytes, rc: int) -> ExecResult:
    """`roche exec --json`: the result it printed, or its error."""
    if out.strip():
        try:
            return parse_exec(json.loads(out))
        except ValueError:
            pass
    raise error_from_stderr(err, rc, "exec")


def first_line(b: bytes) -> Optional[str]:
    s = decode_output(b).strip()
    return s.splitlines()[0] if s else None


def code_args(sandbox_id: str, req: CodeRequest) -> list[str]:
    """`roche code --json-events`, the code on standard input."""
    a = ["code", "--sandbox", sandbox_id, "--json-events"]
    if req.language:
        a += ["--language", req.language]
    if req.context:
        a += ["--context", req.context]
    if req.timeout:
        a += ["--timeout", repr(req.timeout)]
    return a


def context_create_args(sandbox_id: str, language: str, cwd: Optional[str]) -> list[str]:
    a = ["context", "create", "--sandbox", sandbox_id]
    if language:
        a += ["--language", language]
    if cwd:
        a += ["--cwd", cwd]
    return a


def parse_contexts(out: bytes) -> list[Context]:
    """What `roche context list --json` printed."""
    obj = parse_json(out, "context list")
    return [parse_context(c) for c in obj or ()]


class CodeEventParser:
    """Reads `roche code --json-events`: a JSON object a line, output and results while
    the cell runs, the whole execution last."""

    def __init__(self) -> None:
        self.asm = CodeAssembler()
        self._buf = bytearray()
        self.execution: Optional[Any] = None

    def feed(self, data: bytes) -> list[CodeItem]:
        self._buf += data
        items: list[CodeItem] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return items
            line = bytes(self._buf[:nl])
            del self._buf[:nl + 1]
            item = self._line(line)
            if item is not None:
                items.append(item)

    def _line(self, line: bytes) -> Optional[CodeItem]:
        if not line.strip():
            return None
        try:
            m = json.loads(line)
        except ValueError:
            raise RocheError(f"the roche CLI printed {decode_output(line[:200])!r} where a code event was expected") from None
        if not isinstance(m, dict):
            return None
        if "stream" in m:
            data = base64.b64decode(m.get("data") or "")
            return self.asm.output("stderr" if m["stream"] == "stderr" else "stdout", data)
        if "result" in m:
            return self.asm.result(m["result"])
        if "execution" in m:
            self.execution = parse_execution(m["execution"])
            return self.execution
        return None

    def finish(self, stderr: bytes, rc: int) -> None:
        """Raises the CLI's error when it printed no execution."""
        if self._buf.strip():
            self.feed(b"\n")
        if self.execution is None:
            raise error_from_stderr(stderr, rc, "code")


def provider_of(sandbox_id: str) -> str:
    """The provider an id belongs to: every provider but Docker prefixes its ids."""
    head, sep, _ = sandbox_id.partition("-")
    return head if sep and head.isalpha() and head != "docker" else "docker"


def cannot_run(cli: str, err: OSError) -> ProviderUnavailable:
    """The error for a roche CLI that could not be started."""
    return ProviderUnavailable(f"cannot run the roche CLI {cli!r}: {err}: put roche on PATH or set ROCHE_CLI")
