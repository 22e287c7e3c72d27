"""roched's API as the Connect protocol speaks it in JSON: requests, responses, envelopes
and errors. No I/O here; the sync and async transports share it."""

from __future__ import annotations

import base64
import codecs
import json
import re
import struct
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from .errors import InvalidConfig, RocheError, error_for, reason_from_text
from .types import (
    DEFAULT_OUTPUT_LIMIT,
    CodeRequest,
    Context,
    Execution,
    ExecutionError,
    Logs,
    OutputMessage,
    Result,
    CopyReport,
    EgressDecision,
    EndReason,
    ExecRequest,
    ExecResult,
    Receipt,
    OutputEvent,
    SandboxConfig,
    SandboxInfo,
    SkippedEntry,
    SnapshotInfo,
    StoredSecret,
    Stream,
    WorkspaceInfo,
)

SERVICE = "/roche.v1.SandboxService/"
UNARY_HEADERS = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
STREAM_HEADERS = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}

#: An envelope's flags: 0x02 marks the end-of-stream message (which may carry an error).
END_STREAM = 0x02
#: Upload pieces of a tar stream this big (before base64), as the Go client does.
COPY_CHUNK = 32 << 10

#: What an exec's output stream carries: its events, then its result.
StreamItem = Union[OutputEvent, ExecResult]


def config_request(provider: str, cfg: SandboxConfig) -> dict[str, Any]:
    """A CreateRequest. Every field is sent, so the daemon's defaults never replace the caller's."""
    c: dict[str, Any] = {
        "image": cfg.image,
        "network": cfg.network,
        "writable": cfg.writable,
        "timeoutSecs": cfg.timeout_secs,
        "memory": cfg.memory,
        "disk": cfg.disk,
        "cpus": cfg.cpus,
        "pidsLimit": cfg.pids_limit,
    }
    if cfg.env:
        c["env"] = dict(cfg.env)
    if cfg.mounts:
        c["mounts"] = [{"source": m.source, "target": m.target, "readWrite": m.read_write} for m in cfg.mounts]
    if cfg.workdir:
        c["workdir"] = cfg.workdir
    if cfg.user:
        c["user"] = cfg.user
    if cfg.network_allowlist:
        c["networkAllowlist"] = list(cfg.network_allowlist)
    if cfg.workspace:
        c["workspace"] = cfg.workspace
    if cfg.from_snapshot:
        c["fromSnapshot"] = cfg.from_snapshot
    if cfg.workspace_size is not None:
        c["workspaceSize"] = cfg.workspace_size
    if cfg.leased:
        c["leased"] = True
    if cfg.metadata:
        c["metadata"] = dict(cfg.metadata)
    if cfg.secrets:
        c["secrets"] = [{"name": s.name, "value": s.value or "", "hosts": list(s.hosts), "header": s.header or "",
                         "fromStore": bool(s.from_store)} for s in cfg.secrets]
    if cfg.egress_learn:
        c["egressLearn"] = True
    return {"provider": provider, "config": c}


_STATE_NAMES = {
    "running": "SANDBOX_STATE_RUNNING",
    "paused": "SANDBOX_STATE_PAUSED",
    "exited": "SANDBOX_STATE_EXITED",
    "created": "SANDBOX_STATE_CREATED",
}


def list_request(provider: str, metadata: Optional[Mapping[str, str]], state: Optional[str]) -> dict[str, Any]:
    """A ListRequest: roched keeps the sandboxes with every metadata pair and the state."""
    req: dict[str, Any] = {"provider": provider}
    if metadata:
        req["metadata"] = dict(metadata)
    if state:
        req["state"] = _STATE_NAMES[state]
    return req


def leases(providers: Any) -> dict[str, bool]:
    """From a ListProvidersResponse: whether each provider takes leased=true."""
    out: dict[str, bool] = {}
    listed = providers.get("providers") if isinstance(providers, dict) else None
    for p in listed or ():
        if isinstance(p, dict):
            caps = p.get("capabilities")
            out[str(p.get("name", ""))] = bool(isinstance(caps, dict) and caps.get("leases"))
    return out


def exec_request(sandbox_id: str, req: ExecRequest) -> dict[str, Any]:
    """An ExecRequest (also ExecStream's)."""
    m: dict[str, Any] = {"sandboxId": sandbox_id, "cmd": list(req.cmd)}
    if req.env:
        m["env"] = dict(req.env)
    if req.workdir:
        m["workdir"] = req.workdir
    if req.timeout:
        m["timeoutSecs"] = req.timeout
    if req.stdin is not None:
        m["stdin"] = base64.b64encode(req.stdin).decode("ascii")
    if req.idempotency_key is not None:
        m["idempotencyKey"] = req.idempotency_key
    return m


_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_time(s: Optional[str]) -> Optional[datetime]:
    """RFC 3339 with up to nanoseconds (Go's and protobuf's), as an aware datetime."""
    if not s:
        return None
    m = _TIME.match(s)
    if not m:
        return None
    base, frac, zone = m.groups()
    t = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S")
    if frac:
        t = t.replace(microsecond=int(frac[:6].ljust(6, "0")))
    if zone == "Z":
        return t.replace(tzinfo=timezone.utc)
    sign = 1 if zone[0] == "+" else -1
    return t.replace(tzinfo=timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))))


def parse_duration(s: Any) -> float:
    """A protobuf Duration in JSON ("1.5s") as seconds."""
    if isinstance(s, str) and s.endswith("s"):
        try:
            return float(s[:-1])
        except ValueError:
            return 0.0
    return 0.0


_STATES = {
    "SANDBOX_STATE_RUNNING": "running",
    "SANDBOX_STATE_PAUSED": "paused",
    "SANDBOX_STATE_EXITED": "exited",
    "SANDBOX_STATE_CREATED": "created",
}


def parse_sandbox(m: dict[str, Any]) -> SandboxInfo:
    """A Sandbox message."""
    return SandboxInfo(
        id=m.get("id", ""),
        provider=m.get("provider", ""),
        image=m.get("image", ""),
        state=_STATES.get(m.get("state", ""), "exited"),
        created_at=parse_time(m.get("createdAt")),
        expires_at=parse_time(m.get("expiresAt")),
        owner=m.get("owner", ""),
        metadata=dict(m.get("metadata") or {}),
        end=parse_end(m.get("end")),
    )


def parse_end(m: Optional[dict[str, Any]]) -> Optional[EndReason]:
    """An EndReason message (its kind an END_KIND_ name), None for none."""
    if not m:
        return None
    kind = str(m.get("kind", "END_KIND_UNKNOWN"))
    kind = kind[len("END_KIND_"):].lower() if kind.startswith("END_KIND_") else "unknown"
    return EndReason(
        kind="unknown" if kind == "unspecified" else kind,
        at=parse_time(m.get("at")),
        detail=m.get("detail", ""),
        evidence=m.get("evidence", ""),
        by=m.get("by", ""),
        exit_code=int(m.get("exitCode", 0)) if m.get("exitKnown") else None,
    )


def parse_receipt(m: Optional[dict[str, Any]]) -> Optional[Receipt]:
    """A ReceiptUsage message, None for none."""
    if m is None:
        return None
    return Receipt(
        peak_memory_bytes=int(m.get("peakMemoryBytes", 0)),
        cpu_time=parse_duration(m.get("cpuTime")),
        leftover_processes=int(m.get("leftoverProcesses", 0)),
        end=_command_end(m.get("end")),
        evidence=str(m.get("evidence", "")),
    )


def _command_end(kind: Any) -> str:
    """A receipt's EndKind name as the kind ("oom"), "" for unspecified."""
    kind = str(kind or "")
    return kind[len("END_KIND_"):].lower() if kind.startswith("END_KIND_") and kind != "END_KIND_UNSPECIFIED" else ""


def parse_snapshot(m: dict[str, Any]) -> SnapshotInfo:
    """A Snapshot message."""
    return SnapshotInfo(
        name=m.get("name", ""),
        provider=m.get("provider", ""),
        image=m.get("image", ""),
        created_at=parse_time(m.get("createdAt")),
    )


def parse_egress_decision(m: dict[str, Any]) -> EgressDecision:
    """An EgressDecision message, or an object of ``roche egress log --json``."""
    def get(camel: str, snake: str, default: Any) -> Any:
        return m.get(camel, m.get(snake, default))
    return EgressDecision(
        seq=int(get("seq", "seq", 0)),
        time=parse_time(m.get("time")),
        sandbox=str(get("sandboxId", "sandbox", "")),
        tenant=str(m.get("tenant", "")),
        host=str(m.get("host", "")),
        port=int(m.get("port", 0)),
        addr=str(m.get("addr", "")),
        method=str(m.get("method", "")),
        path=str(m.get("path", "")),
        rule=str(m.get("rule", "")),
        allowed=bool(m.get("allowed", False)),
        reason=str(m.get("reason", "")),
        bytes_out=int(get("bytesOut", "bytes_out", 0)),
        bytes_in=int(get("bytesIn", "bytes_in", 0)),
        done=bool(m.get("done", False)),
    )


def parse_stored_secret(m: dict[str, Any]) -> StoredSecret:
    """A StoredSecret message, or an object of ``roche secret list --json``."""
    return StoredSecret(
        name=str(m.get("name", "")),
        updated=parse_time(m.get("updatedAt", m.get("updated"))),
        sandboxes=[str(s) for s in m.get("sandboxes") or []],
    )


def parse_workspace(m: dict[str, Any]) -> WorkspaceInfo:
    """A Workspace message."""
    return WorkspaceInfo(
        name=m.get("name", ""),
        provider=m.get("provider", ""),
        created_at=parse_time(m.get("createdAt")),
        in_use_by=tuple(m.get("inUseBy") or ()),
        # int64 travels as a JSON string.
        size_bytes=int(m.get("sizeBytes") or 0),
    )


def _b64(s: Optional[str]) -> bytes:
    return base64.b64decode(s) if s else b""


def decode_output(b: bytes) -> str:
    """Programs print anything: undecodable bytes become U+FFFD rather than an error."""
    return b.decode("utf-8", errors="replace")


def parse_result(m: dict[str, Any]) -> ExecResult:
    """An ExecResult message."""
    return ExecResult(
        stdout=decode_output(_b64(m.get("stdout"))),
        stderr=decode_output(_b64(m.get("stderr"))),
        exit_code=int(m.get("exitCode", 0)),
        timed_out=bool(m.get("timedOut", False)),
        truncated=bool(m.get("truncated", False)),
        oom_killed=bool(m.get("oomKilled", False)),
        duration=parse_duration(m.get("duration")),
        receipt=parse_receipt(m.get("receipt")),
    )


def envelope(msg: dict[str, Any], flags: int = 0) -> bytes:
    """One message of a Connect stream: flags, big-endian length, JSON."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(body)) + body


def envelope_header(b: bytes) -> tuple[int, int]:
    """The flags and length of the envelope whose 5-byte prefix is b."""
    flags, length = struct.unpack(">BI", b)
    return flags, length


def copy_to_messages(sandbox_id: str, dst: str, pieces: Iterable[bytes], max_bytes: int = 0) -> Iterator[bytes]:
    """CopyTo's request stream: the first message names the sandbox, the destination and
    the cap (0: the daemon's). Pieces are gathered into messages of about COPY_CHUNK."""
    first: dict[str, Any] = {"sandboxId": sandbox_id, "dst": dst}
    if max_bytes:
        first["maxBytes"] = max_bytes
    buf = bytearray()
    for piece in pieces:
        buf += piece
        while len(buf) >= COPY_CHUNK:
            m: dict[str, Any] = {"tarChunk": base64.b64encode(bytes(buf[:COPY_CHUNK])).decode("ascii")}
            del buf[:COPY_CHUNK]
            if first:
                m.update(first)
                first = {}
            yield envelope(m)
    if buf or first:
        m = {"tarChunk": base64.b64encode(bytes(buf)).decode("ascii")}
        m.update(first)
        yield envelope(m)


def copy_from_request(sandbox_id: str, src: str, max_bytes: int = 0, preserve_links: bool = False) -> bytes:
    """A CopyFromRequest envelope; max_bytes 0 leaves the cap to the daemon."""
    m: dict[str, Any] = {"sandboxId": sandbox_id, "src": src}
    if max_bytes:
        m["maxBytes"] = max_bytes
    if preserve_links:
        m["preserveLinks"] = True
    return envelope(m)


def tar_chunk(m: dict[str, Any]) -> bytes:
    """The piece of tar stream a CopyFromResponse carries."""
    return _b64(m.get("tarChunk"))


def end_stream_metadata(body: bytes) -> dict[str, list[str]]:
    """The trailers an end-of-stream message carries, keys lower-cased."""
    try:
        obj = json.loads(body or b"{}")
    except ValueError:
        return {}
    md = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(md, dict):
        return {}
    return {str(k).lower(): [str(v) for v in vs] if isinstance(vs, list) else [str(vs)] for k, vs in md.items()}


def skipped_from_trailers(md: dict[str, list[str]]) -> CopyReport:
    """What roched's CopyFrom left out, from its trailers (client/copytrailer.go's side)."""
    def count(key: str) -> int:
        try:
            return int((md.get(key) or ["0"])[0])
        except ValueError:
            return 0
    examples = []
    for v in md.get("roche-skipped-example", []):
        try:
            e = json.loads(v)
            examples.append(SkippedEntry(str(e.get("path", "")), str(e.get("target", "")), str(e.get("reason", ""))))
        except (ValueError, AttributeError):
            continue
    return CopyReport(skipped=count("roche-skipped"), skipped_links=count("roche-skipped-links"), examples=tuple(examples))


_CODE_REASONS = {
    "not_found": "not_found",
    "invalid_argument": "invalid_config",
    "unavailable": "unavailable",
    "deadline_exceeded": "timeout",
    "unimplemented": "unsupported",
    "resource_exhausted": "exhausted",
    "permission_denied": "permission_denied",
    "out_of_range": "output_gone",
}

_DETAIL_REASONS = {
    "ERROR_REASON_NOT_FOUND": "not_found",
    "ERROR_REASON_INVALID_CONFIG": "invalid_config",
    "ERROR_REASON_UNAVAILABLE": "unavailable",
    "ERROR_REASON_TIMEOUT": "timeout",
    "ERROR_REASON_UNSUPPORTED": "unsupported",
    "ERROR_REASON_IMAGE_NOT_FOUND": "image_not_found",
    "ERROR_REASON_EXHAUSTED": "exhausted",
    "ERROR_REASON_PERMISSION": "permission_denied",
    "ERROR_REASON_IN_USE": "in_use",
    "ERROR_REASON_NOT_CONFIGURED": "unavailable",  # a provider not set up here
    "ERROR_REASON_OUTPUT_GONE": "output_gone",
}
_DETAIL_NUMBERS = dict(enumerate(["", "not_found", "invalid_config", "unavailable", "timeout",
                                  "unsupported", "image_not_found", "exhausted", "permission_denied",
                                  "in_use", "unavailable", "output_gone"]))


def _proto_fields(raw: bytes) -> Optional[dict[int, Any]]:
    """The fields of a protobuf message with varint and length-delimited fields only (the
    last of each number), or None when it does not parse as such."""
    fields: dict[int, Any] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            if i >= len(raw) or shift > 63:
                raise ValueError("truncated varint")
            b = raw[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    try:
        while i < len(raw):
            key = varint()
            num, kind = key >> 3, key & 7
            if kind == 0:
                fields[num] = varint()
            elif kind == 2:
                n = varint()
                if i + n > len(raw):
                    return None
                fields[num] = raw[i:i + n]
                i += n
            else:
                return None
    except ValueError:
        return None
    return fields


def _detail_fields(d: dict[str, Any]) -> Optional[dict[int, Any]]:
    """The fields of a Connect error detail's binary value (base64, unpadded)."""
    try:
        return _proto_fields(base64.b64decode(d.get("value", "") + "=="))
    except ValueError:
        return None


def _detail_reason(d: dict[str, Any]) -> str:
    if d.get("type") != "roche.v1.ErrorDetail":
        return ""
    debug = d.get("debug")
    if isinstance(debug, dict) and debug.get("reason") in _DETAIL_REASONS:
        return _DETAIL_REASONS[debug["reason"]]
    # The binary detail: field 1, the reason's number.
    fields = _detail_fields(d) or {}
    reason = fields.get(1)
    return _DETAIL_NUMBERS.get(reason, "") if isinstance(reason, int) else ""


def _detail_retry_after(d: dict[str, Any]) -> Optional[float]:
    """The wait, in seconds, of a google.rpc.RetryInfo detail: retry_delay (field 1), a
    google.protobuf.Duration (seconds 1, nanos 2)."""
    if d.get("type") != "google.rpc.RetryInfo":
        return None
    debug = d.get("debug")
    if isinstance(debug, dict) and (delay := parse_duration(debug.get("retryDelay"))) > 0:
        return delay
    raw = (_detail_fields(d) or {}).get(1)
    dur = _proto_fields(raw) if isinstance(raw, bytes) else None
    if dur is None:
        return None
    seconds, nanos = dur.get(1, 0), dur.get(2, 0)
    if not isinstance(seconds, int) or not isinstance(nanos, int):
        return None
    return seconds + nanos / 1e9


def error_from_connect(obj: Any, status: int, where: str) -> RocheError:
    """The typed exception for a Connect error object ({"code", "message", "details"})."""
    if not isinstance(obj, dict):
        return RocheError(f"roched at {where} answered HTTP {status} without a Connect error")
    code = str(obj.get("code", ""))
    message = str(obj.get("message") or code or f"HTTP {status}")
    reason = ""
    retry_after: Optional[float] = None
    for d in obj.get("details") or []:
        if isinstance(d, dict):
            reason = reason or _detail_reason(d)
            if retry_after is None:
                retry_after = _detail_retry_after(d)
    if not reason:
        reason = _CODE_REASONS.get(code, "") or reason_from_text(message)
    if code == "unauthenticated":
        return RocheError(f"{message} (pass token= or token_file=, or set ROCHE_TOKEN or ROCHE_TOKEN_FILE)",
                          "unauthenticated")
    return error_for(reason, message, retry_after)


class OutputAssembler:
    """Turns output pieces into events, keeping a capped copy of each stream for the
    result and decoding characters split across pieces whole."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self._limit = limit
        self._kept: dict[Stream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in self._kept}
        self.truncated = False

    def output(self, stream: Stream, data: bytes) -> OutputEvent:
        kept = self._kept[stream]
        room = self._limit - len(kept)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            kept += data[:room]
        return OutputEvent(stream, data, self._decoders[stream].decode(data))

    def result(self, r: ExecResult) -> ExecResult:
        """The final result with the output kept from the events."""
        return ExecResult(
            stdout=decode_output(bytes(self._kept["stdout"])),
            stderr=decode_output(bytes(self._kept["stderr"])),
            exit_code=r.exit_code,
            timed_out=r.timed_out,
            truncated=r.truncated or self.truncated,
            oom_killed=r.oom_killed,
            duration=r.duration,
        )


def stream_event(m: dict[str, Any], out: OutputAssembler) -> tuple[Optional[OutputEvent], Optional[ExecResult]]:
    """One ExecStreamResponse: an output event, the result, or neither (a heartbeat)."""
    if "output" in m:
        o = m["output"]
        stream: Stream = "stderr" if o.get("stream") == "OUTPUT_STREAM_STDERR" else "stdout"
        return out.output(stream, _b64(o.get("data"))), None
    if "result" in m:
        return None, out.result(parse_result(m["result"]))
    return None, None


def error_response(body: bytes, status: int, where: str) -> RocheError:
    """The typed exception for a streaming call's response of an HTTP status other than
    200, whose body is a Connect error."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    return error_from_connect(obj, status, where)


def end_stream_error(body: bytes, where: str) -> Optional[RocheError]:
    """The error an end-of-stream message carries, if any."""
    try:
        obj = json.loads(body or b"{}")
    except ValueError:
        return RocheError(f"roched at {where} sent a malformed end of stream")
    err = obj.get("error") if isinstance(obj, dict) else None
    if err:
        return error_from_connect(err, 200, where)
    return None


# Code contexts. The CLI's --json prints Go's snake_case names and roched's Connect JSON
# camelCase ones; the readers below take either, so both transports share them.

def code_request(sandbox_id: str, req: CodeRequest) -> dict[str, Any]:
    """A RunCodeRequest."""
    m: dict[str, Any] = {"sandboxId": sandbox_id, "code": req.code}
    if req.language:
        m["language"] = req.language
    if req.context:
        m["contextId"] = req.context
    if req.timeout:
        m["timeoutSecs"] = req.timeout
    return m


def _field(m: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    return m.get(camel, m.get(snake, default))


def parse_code_result(m: dict[str, Any]) -> Result:
    """A CodeResult; png and jpeg stay base64 text (as E2B's), json is parsed."""
    raw_json = m.get("json")
    parsed: Optional[object] = None
    if raw_json:
        try:
            parsed = json.loads(raw_json)
        except ValueError:
            parsed = raw_json
    return Result(
        text=m.get("text") or None,
        html=m.get("html") or None,
        markdown=m.get("markdown") or None,
        svg=m.get("svg") or None,
        png=m.get("png") or None,
        jpeg=m.get("jpeg") or None,
        latex=m.get("latex") or None,
        json=parsed,
        javascript=m.get("javascript") or None,
        is_main_result=bool(_field(m, "isMainResult", "is_main_result", False)),
    )


def parse_code_error(m: Any) -> Optional[ExecutionError]:
    if not isinstance(m, dict):
        return None
    return ExecutionError(str(m.get("name", "")), str(m.get("value", "")), str(m.get("traceback", "")))


def parse_execution(m: dict[str, Any], results: Optional[list[Result]] = None, logs: Optional[Logs] = None,
                    truncated: bool = False) -> Execution:
    """A CodeExecution (roched's) or an execution as `roche code --json` prints it;
    results and logs, when given, replace the message's (roched streams them before it)."""
    if results is None:
        results = [parse_code_result(r) for r in m.get("results") or () if isinstance(r, dict)]
    if logs is None:
        lm = m.get("logs") if isinstance(m.get("logs"), dict) else m
        logs = Logs([str(x) for x in lm.get("stdout") or ()], [str(x) for x in lm.get("stderr") or ()])
    if "duration_ns" in m:
        duration = int(m.get("duration_ns") or 0) / 1e9
    else:
        duration = parse_duration(m.get("duration"))
    return Execution(
        results=results,
        logs=logs,
        error=parse_code_error(m.get("error")),
        execution_count=int(_field(m, "executionCount", "execution_count", 0) or 0),
        context=str(_field(m, "contextId", "context", "") or ""),
        timed_out=bool(_field(m, "timedOut", "timed_out", False)),
        restarted=bool(m.get("restarted", False)),
        truncated=bool(m.get("truncated", False)) or truncated,
        duration=duration,
    )


def parse_context(m: Any) -> Context:
    """A CodeContext."""
    if not isinstance(m, dict):
        raise RocheError(f"Roche sent {m!r} where a code context was expected")
    return Context(id=str(m.get("id", "")), language=str(m.get("language", "")), cwd=str(m.get("cwd", "")),
                   default=bool(m.get("default", False)))


CodeItem = Any  # OutputMessage | Result | Execution, the last one last


class CodeAssembler:
    """Turns a cell's events into OutputMessages and Results as they come, keeping a
    capped copy of the logs and the results for the Execution."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self._limit = limit
        self._kept = {"stdout": 0, "stderr": 0}
        self._logs: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in self._kept}
        self.results: list[Result] = []
        self.truncated = False

    def output(self, stream: str, data: bytes) -> Optional[OutputMessage]:
        text = self._decoders[stream].decode(data)
        if not text:
            return None
        room = self._limit - self._kept[stream]
        if len(data) > room:
            self.truncated = True
        if room > 0:
            self._logs[stream].append(text if len(data) <= room else decode_output(data[:room]))
            self._kept[stream] += min(len(data), room)
        return OutputMessage(text, time.time_ns(), stream == "stderr")

    def result(self, m: dict[str, Any]) -> Result:
        r = parse_code_result(m)
        self.results.append(r)
        return r

    def logs(self) -> Logs:
        return Logs(list(self._logs["stdout"]), list(self._logs["stderr"]))


def code_event(m: dict[str, Any], asm: CodeAssembler) -> Optional[CodeItem]:
    """One RunCodeResponse: an OutputMessage, a Result, the Execution, or None (a heartbeat)."""
    if "output" in m:
        o = m["output"]
        stream = "stderr" if o.get("stream") == "OUTPUT_STREAM_STDERR" else "stdout"
        return asm.output(stream, _b64(o.get("data")))
    if "result" in m:
        return asm.result(m["result"])
    if "execution" in m:
        return parse_execution(m["execution"], asm.results, asm.logs(), asm.truncated)
    return None


# PTY sessions: a command on a pseudo-terminal, driven with unary calls (input, resize,
# kill) and one server stream of its output.

#: The most bytes one send_input carries (the agent's frame).
PTY_MAX_INPUT = 256 << 10


def pty_size(cols: int, rows: int) -> dict[str, int]:
    """A PtySize, checked."""
    for name, v in (("cols", cols), ("rows", rows)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 4096:
            raise InvalidConfig(f"{name} {v!r}: give a number of characters from 1 to 4096")
    return {"cols": cols, "rows": rows}


def pty_create_request(sandbox_id: str, cols: int, rows: int, cmd: Optional[Sequence[str]],
                       env: Optional[Mapping[str, str]], workdir: Optional[str]) -> dict[str, Any]:
    """A CreatePtyRequest."""
    m: dict[str, Any] = {"sandboxId": sandbox_id, "size": pty_size(cols, rows)}
    if cmd is not None:
        if isinstance(cmd, str) or not all(isinstance(a, str) for a in cmd):
            raise InvalidConfig("cmd must be a list of strings (the argv), e.g. ['python3']")
        m["cmd"] = list(cmd)
    if env:
        m["env"] = dict(env)
    if workdir:
        m["workdir"] = workdir
    return m


def pty_input(sandbox_id: str, pid: int, data: Union[bytes, str]) -> dict[str, Any]:
    """A SendPtyInputRequest."""
    if isinstance(data, str):
        data = data.encode()
    if len(data) > PTY_MAX_INPUT:
        raise InvalidConfig(f"{len(data)} bytes of input at once is over the limit of {PTY_MAX_INPUT}: send it in parts")
    return {"sandboxId": sandbox_id, "pid": pid, "data": base64.b64encode(bytes(data)).decode()}


def pty_event(m: dict[str, Any]) -> tuple[Optional[bytes], Optional[ExecResult]]:
    """One ConnectPtyResponse: output, the result, or neither (a heartbeat)."""
    if "data" in m:
        return base64.b64decode(m["data"]), None
    if "result" in m:
        return None, parse_result(m["result"])
    return None, None
