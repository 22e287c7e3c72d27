"""The two ways to Roche: roched over HTTP (the Connect protocol in JSON), or the roche
CLI as a subprocess per call. Both offer the same calls and raise the same typed
exceptions. Cancelling an async call ends it there too (the connection is closed, or the
CLI is stopped), so a cancelled exec kills its command.

This is the asyncio half, and the source of the synchronous one, _transport.py, which
unasync.py writes from it: edit this file, then run `python3 sdk/python/unasync.py`."""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import tempfile
import threading
import time
import uuid
# typing.List: inside these classes "list" names their list() method.
from typing import IO, Any, AsyncGenerator, AsyncIterator, Callable, List, Mapping, Optional, Protocol, TypeVar, Union

from . import _aio, _cli, _cmdwire, _filesutil, _retry, _tarutil, _wire
from ._ahttp import AsyncHTTPClient
from ._deadline import Deadline
from ._filesutil import EntryInfo, FilesystemEvent
from ._discovery import Endpoint
from ._lease import UNDO_TIMEOUT, CLIHold, DaemonHold, Holds
from ._wire import StreamItem
from .errors import InvalidConfig, PermissionDenied, ProviderUnavailable, RocheError, SandboxNotFound
from .types import (CodeRequest, CommandInfo, Context, CopyReport, ExecRequest, ExecResult, Execution, SandboxConfig,
                    SandboxInfo, SnapshotInfo, StoredSecret, WorkspaceInfo, EgressDecision)

T = TypeVar("T")


class AsyncTransport(Protocol):
    """What a sandbox needs from its way to Roche."""

    name: str

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo: ...
    async def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult: ...
    def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]: ...
    async def destroy(self, sid: str, d: Deadline) -> None: ...
    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo: ...
    async def inspect_ended(self, sid: str, d: Deadline) -> SandboxInfo: ...
    async def list(self, provider: str, d: Deadline, metadata: Optional[Mapping[str, str]] = None,
                   state: Optional[str] = None) -> list[SandboxInfo]: ...
    async def set_timeout(self, sid: str, seconds: int, d: Deadline) -> SandboxInfo: ...
    async def pause(self, sid: str, pause: bool, d: Deadline) -> None: ...
    # Memory snapshots (providers that have them: vm's qemu).
    async def pause_to_disk(self, sid: str, d: Deadline) -> None: ...
    async def resume(self, sid: str, d: Deadline) -> SandboxInfo: ...
    async def fork(self, sid: str, count: int, d: Deadline) -> List[SandboxInfo]: ...
    async def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None: ...
    async def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes: ...
    async def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport: ...
    async def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                        preserve_links: bool = False) -> CopyReport: ...
    async def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo: ...
    async def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo: ...
    async def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]: ...
    async def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None: ...
    async def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]: ...
    async def delete_workspace(self, provider: str, name: str, d: Deadline) -> None: ...
    # The egress proxy of a sandbox with an allowlist (roched's).
    async def egress_log(self, sid: str, d: Deadline) -> List[EgressDecision]: ...
    async def egress_suggest(self, sid: str, d: Deadline) -> List[str]: ...
    async def egress_policy(self, sid: str, allow: List[str], remove: List[str], d: Deadline) -> List[str]: ...
    # roched's secret store (through the CLI too: it asks roched).
    async def set_secret(self, name: str, value: str, sandbox: Optional[str], d: Deadline) -> List[str]: ...
    async def list_secrets(self, d: Deadline) -> List[StoredSecret]: ...
    async def remove_secret(self, name: str, d: Deadline) -> None: ...
    def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> AsyncIterator[_wire.CodeItem]: ...
    async def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context: ...
    async def contexts(self, sid: str, d: Deadline) -> List[Context]: ...
    async def restart_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    async def remove_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    async def fork_context(self, sid: str, cid: str, d: Deadline) -> Context: ...
    # The files API (sandbox.files).
    def file_read(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int]) -> AsyncIterator[Union[EntryInfo, bytes]]: ...
    async def file_write(self, sid: str, path: str, content: Any, mode: int, d: Deadline,
                         max_bytes: Optional[int]) -> EntryInfo: ...
    async def file_list(self, sid: str, path: str, depth: int, d: Deadline) -> List[EntryInfo]: ...
    async def file_stat(self, sid: str, path: str, d: Deadline, missing_ok: bool = False) -> Optional[EntryInfo]: ...
    async def file_mkdir(self, sid: str, path: str, d: Deadline) -> bool: ...
    async def file_rename(self, sid: str, old: str, new: str, d: Deadline) -> EntryInfo: ...
    async def file_remove(self, sid: str, path: str, d: Deadline) -> None: ...
    def file_watch(self, sid: str, path: str, recursive: bool, d: Deadline,
                   abort: _filesutil.Abort) -> AsyncIterator[Optional[FilesystemEvent]]: ...
    async def start_command(self, sid: str, req: _cmdwire.CommandRequest, d: Deadline) -> CommandInfo: ...
    def connect_command(self, sid: str, sel: dict[str, Any], stdout_offset: int, stderr_offset: int,
                        d: Deadline) -> AsyncIterator[_cmdwire.Event]: ...
    async def list_commands(self, sid: str, d: Deadline) -> List[CommandInfo]: ...
    async def send_command_input(self, sid: str, sel: dict[str, Any], data: bytes, d: Deadline) -> None: ...
    async def close_command_input(self, sid: str, sel: dict[str, Any], d: Deadline) -> None: ...
    async def signal_command(self, sid: str, sel: dict[str, Any], sig: int, d: Deadline) -> None: ...
    def close(self) -> None: ...


class AsyncConnectClient:
    """roched's API in the Connect protocol (JSON), over HTTP/1.1."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.http = AsyncHTTPClient(ep)
        # Whether a roched has answered this client: only then is one that does not
        # listen (restarting) waited for by a retry (_retry).
        self.reached = False

    def close(self) -> None:
        self.http.close()

    async def health(self, timeout: float) -> dict[str, Any]:
        """GET /healthz; raises ProviderUnavailable when nothing answers."""
        status, body = await self.http.get("/healthz", timeout)
        if status != 200:
            raise ProviderUnavailable(f"roched on {self.ep.where} answered /healthz with HTTP {status}")
        try:
            health: dict[str, Any] = json.loads(body)
        except ValueError as e:
            raise self.ep.unreachable(e) from None
        return health

    async def unary(self, method: str, msg: dict[str, Any], d: Deadline, retry: bool = False) -> dict[str, Any]:
        """One request, one response. With retry (a call safe to repeat), a lost
        connection is tried again within d (_retry)."""
        if not retry:
            return await self._unary(method, msg, d)
        backoff = _retry.Backoff(d)
        while True:
            try:
                return await self._unary(method, msg, d)
            except ProviderUnavailable as e:
                wait = backoff.next(e, self.reached)
                if wait is None:
                    raise
                await _aio.sleep(wait)

    async def _unary(self, method: str, msg: dict[str, Any], d: Deadline) -> dict[str, Any]:
        body = json.dumps(msg, separators=(",", ":")).encode()
        async with self.http.exchange(_wire.SERVICE + method, _wire.UNARY_HEADERS, body, d) as resp:
            data = await resp.read_all()
            status = resp.status
        self.reached = True
        try:
            obj = json.loads(data) if data else {}
        except ValueError:
            obj = None
        if status != 200:
            raise _wire.error_from_connect(obj, status, self.ep.where)
        if not isinstance(obj, dict):
            raise RocheError(f"roched on {self.ep.where} sent a malformed {method} response")
        return obj

    async def stream(self, method: str, body: Any, d: Deadline,
                     trailers: Optional[dict[str, list[str]]] = None) -> AsyncGenerator[dict[str, Any], None]:
        """The messages of a streaming response; body is one envelope or an iterable of
        them. Closing the iterator early closes the connection, which cancels the call.
        The response's trailers go into trailers, when given, once the stream has ended."""
        async for m in self.stream_raw(method, body, d, _wire.STREAM_HEADERS, trailers):
            yield json.loads(m)

    async def stream_raw(self, method: str, body: Any, d: Deadline, headers: dict[str, str],
                         trailers: Optional[dict[str, list[str]]] = None,
                         abort: Optional[_filesutil.Abort] = None) -> AsyncGenerator[bytes, None]:
        """stream()'s messages undecoded, for a call in another codec (headers say which:
        file content goes in binary protobuf, a third smaller than base64 in JSON). With
        abort, the call can be broken off from elsewhere (a watch's stop())."""
        async with self.http.exchange(_wire.SERVICE + method, headers, body, d) as resp:
            if abort is not None:
                abort.set(resp.abort)
            self.reached = True
            if resp.status != 200:
                raise _wire.error_response(await resp.read_all(), resp.status, self.ep.where)
            while True:
                head = await resp.read(5)
                if len(head) < 5:
                    raise RocheError(f"roched on {self.ep.where} ended {method} without an end-of-stream message")
                flags, n = _wire.envelope_header(head)
                data = await resp.read(n)
                if len(data) < n:
                    raise RocheError(f"roched on {self.ep.where} cut a {method} message short")
                if flags & _wire.END_STREAM:
                    await resp.read_all()
                    if trailers is not None:
                        trailers.update(_wire.end_stream_metadata(data))
                    err = _wire.end_stream_error(data, self.ep.where)
                    if err is not None:
                        raise err
                    return
                yield data


class AsyncDaemonTransport:
    """roched's API."""

    name = "daemon"

    def __init__(self, ep: Endpoint) -> None:
        self.api = AsyncConnectClient(ep)
        self.holds = Holds()
        self._leases: Optional[dict[str, bool]] = None

    def close(self) -> None:
        for h in self.holds.pop_all():
            h.release()
        self.api.close()

    async def _provider_leases(self, provider: str, d: Deadline) -> bool:
        """Whether roched takes leased=true for the provider (asked once)."""
        if self._leases is None:
            self._leases = _wire.leases(await self.api.unary("ListProviders", {}, d, retry=True))
        return self._leases.get(provider, False)

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if cfg.leased and not await self._provider_leases(provider, d):
            cfg = dataclasses.replace(cfg, leased=False)  # a roched without leases: as before them
        # Every create has an idempotency key, so that one whose answer was lost is
        # asked again: roched answers the same key with the sandbox it made.
        req = {**_wire.config_request(provider, cfg), "idempotencyKey": "sdk-" + uuid.uuid4().hex}
        m = await self.api.unary("Create", req, d, retry=True)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        if cfg.leased:
            await self._hold(info.id, d)
        return info

    async def _hold(self, sid: str, d: Deadline) -> None:
        """Holds a leased sandbox just made (from a thread of its own, see _lease); one
        that cannot be held is destroyed."""
        h = DaemonHold(self.api.ep, sid)
        try:
            await _aio.in_thread(h.start, d)
        except _aio.Cancelled:
            h.release()  # roched destroys it shortly
            raise
        except BaseException:
            try:
                await self.destroy(sid, Deadline(UNDO_TIMEOUT))
            except RocheError:
                pass  # not held, roched destroys it shortly anyway
            raise
        self.holds.add(sid, h)

    async def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult:
        # With an idempotency key the command is the sandbox's: a retry joins it.
        m = await self.api.unary("Exec", _wire.exec_request(sid, req), d, retry=req.idempotency_key is not None)
        return _wire.parse_result(m.get("result", {}))

    async def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]:
        out = _wire.OutputAssembler()
        messages = self.api.stream("ExecStream", _wire.envelope(_wire.exec_request(sid, req)), d)
        try:
            async for m in messages:
                event, result = _wire.stream_event(m, out)
                if event is not None:
                    yield event
                if result is not None:
                    yield result
                    return
        finally:
            await messages.aclose()
        raise RocheError("roched ended the output stream without a result")

    async def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> AsyncIterator[_wire.CodeItem]:
        asm = _wire.CodeAssembler()
        messages = self.api.stream("RunCode", _wire.envelope(_wire.code_request(sid, req)), d)
        try:
            async for m in messages:
                item = _wire.code_event(m, asm)
                if item is not None:
                    yield item
                    if isinstance(item, Execution):
                        return
        finally:
            await messages.aclose()
        raise RocheError("roched ended the code stream without an execution")

    async def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context:
        m: dict[str, object] = {"sandboxId": sid}
        if language:
            m["language"] = language
        if cwd:
            m["cwd"] = cwd
        return _wire.parse_context((await self.api.unary("CreateContext", m, d)).get("context"))

    async def contexts(self, sid: str, d: Deadline) -> List[Context]:
        m = await self.api.unary("ListContexts", {"sandboxId": sid}, d, retry=True)
        return [_wire.parse_context(c) for c in m.get("contexts", [])]

    async def restart_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self.api.unary("RestartContext", {"sandboxId": sid, "contextId": cid}, d)

    async def remove_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self.api.unary("RemoveContext", {"sandboxId": sid, "contextId": cid}, d)

    async def fork_context(self, sid: str, cid: str, d: Deadline) -> Context:
        m = await self.api.unary("ForkContext", {"sandboxId": sid, "contextId": cid}, d)
        return _wire.parse_context(m.get("context"))

    async def start_command(self, sid: str, req: _cmdwire.CommandRequest, d: Deadline) -> CommandInfo:
        m = await self.api.unary("StartCommand", _cmdwire.start_request(sid, req), d)
        return _cmdwire.parse_command(m.get("command"))

    async def connect_command(self, sid: str, sel: dict[str, Any], stdout_offset: int, stderr_offset: int,
                              d: Deadline) -> AsyncIterator[_cmdwire.Event]:
        body = _wire.envelope(_cmdwire.connect_request(sid, sel, stdout_offset, stderr_offset))
        messages = self.api.stream("ConnectCommand", body, d)
        try:
            async for m in messages:
                ev = _cmdwire.daemon_event(m)
                if ev is not None:
                    yield ev
                    if isinstance(ev, _cmdwire.Ended):
                        return
        finally:
            await messages.aclose()
        raise RocheError("roched ended the command's stream without its end")

    async def list_commands(self, sid: str, d: Deadline) -> List[CommandInfo]:
        m = await self.api.unary("ListCommands", {"sandboxId": sid}, d, retry=True)
        return [_cmdwire.parse_command(c) for c in m.get("commands", [])]

    async def send_command_input(self, sid: str, sel: dict[str, Any], data: bytes, d: Deadline) -> None:
        await self.api.unary("SendCommandInput", _cmdwire.input_request(sid, sel, data), d)

    async def close_command_input(self, sid: str, sel: dict[str, Any], d: Deadline) -> None:
        await self.api.unary("CloseCommandInput", {"sandboxId": sid, "command": sel}, d)

    async def signal_command(self, sid: str, sel: dict[str, Any], sig: int, d: Deadline) -> None:
        await self.api.unary("SignalCommand", {"sandboxId": sid, "command": sel, "signal": sig}, d)

    async def destroy(self, sid: str, d: Deadline) -> None:
        try:
            await self.api.unary("Destroy", {"ids": [sid]}, d, retry=True)
        except SandboxNotFound:
            pass  # roched serves no such sandbox (any more, a retry's first try included): destroy is idempotent
        finally:
            # Let go after the Destroy: one that failed still ends, when the hold does.
            h = self.holds.pop(sid)
            if h is not None:
                h.release()

    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        m = await self.api.unary("Inspect", {"sandboxId": sid}, d, retry=True)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    async def inspect_ended(self, sid: str, d: Deadline) -> SandboxInfo:
        m = await self.api.unary("Inspect", {"sandboxId": sid, "includeEnded": True}, d, retry=True)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    async def list(self, provider: str, d: Deadline, metadata: Optional[Mapping[str, str]] = None,
                   state: Optional[str] = None) -> list[SandboxInfo]:
        m = await self.api.unary("List", _wire.list_request(provider, metadata, state), d, retry=True)
        return [_wire.parse_sandbox(s) for s in m.get("sandboxes", [])]

    async def set_timeout(self, sid: str, seconds: int, d: Deadline) -> SandboxInfo:
        m = await self.api.unary("SetTimeout", {"sandboxId": sid, "timeoutSecs": seconds}, d)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    async def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        await self.api.unary("Pause" if pause else "Unpause", {"sandboxId": sid}, d)

    async def pause_to_disk(self, sid: str, d: Deadline) -> None:
        await self.api.unary("Pause", {"sandboxId": sid, "toDisk": True}, d)

    async def resume(self, sid: str, d: Deadline) -> SandboxInfo:
        m = await self.api.unary("Resume", {"sandboxId": sid}, d)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    async def fork(self, sid: str, count: int, d: Deadline) -> List[SandboxInfo]:
        m = await self.api.unary("Fork", {"sandboxId": sid, "count": count}, d)
        return [_wire.parse_sandbox(s) for s in m.get("sandboxes", [])]

    async def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        m = await self.api.unary("Reset", {"sandboxId": sid, "wipeWorkspace": not keep_workspace}, d)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        old = self.holds.pop(sid)
        if old is not None:
            # roched keeps the lease for the new sandbox and waits for its first Hold.
            old.release()
            await self._hold(info.id, d)
        return info

    async def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo:
        m = await self.api.unary("CreateSnapshot", {"sandboxId": sid, "name": name}, d)
        return _wire.parse_snapshot(m.get("snapshot", {}))

    async def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]:
        m = await self.api.unary("ListSnapshots", {"provider": provider}, d, retry=True)
        return [_wire.parse_snapshot(s) for s in m.get("snapshots", [])]

    async def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None:
        await self.api.unary("RemoveSnapshot", {"name": name, "provider": provider}, d)

    async def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]:
        m = await self.api.unary("ListWorkspaces", {"provider": provider}, d, retry=True)
        return [_wire.parse_workspace(w) for w in m.get("workspaces", [])]

    async def delete_workspace(self, provider: str, name: str, d: Deadline) -> None:
        await self.api.unary("RemoveWorkspace", {"name": name, "provider": provider}, d)

    async def egress_log(self, sid: str, d: Deadline) -> List[EgressDecision]:
        m = await self.api.unary("EgressLog", {"sandboxId": sid}, d)
        return [_wire.parse_egress_decision(x) for x in m.get("decisions", [])]

    async def egress_suggest(self, sid: str, d: Deadline) -> List[str]:
        m = await self.api.unary("EgressLog", {"sandboxId": sid}, d)
        return [str(r) for r in m.get("suggested", [])]

    async def egress_policy(self, sid: str, allow: List[str], remove: List[str], d: Deadline) -> List[str]:
        m = await self.api.unary("EgressPolicy", {"sandboxId": sid, "allow": allow, "remove": remove}, d)
        return [str(r) for r in m.get("rules", [])]

    async def set_secret(self, name: str, value: str, sandbox: Optional[str], d: Deadline) -> List[str]:
        msg = {"name": name, "value": value}
        if sandbox:
            msg["sandboxId"] = sandbox
        m = await self.api.unary("SetSecret", msg, d)
        return [str(r) for r in m.get("rotated", [])]

    async def list_secrets(self, d: Deadline) -> List[StoredSecret]:
        m = await self.api.unary("ListSecrets", {}, d, retry=True)
        return [_wire.parse_stored_secret(s) for s in m.get("secrets", [])]

    async def remove_secret(self, name: str, d: Deadline) -> None:
        await self.api.unary("RemoveSecret", {"name": name}, d)

    async def _upload(self, body: Any, d: Deadline) -> None:
        messages = self.api.stream("CopyTo", body, d)
        async for _ in messages:
            pass

    async def _download(self, req: bytes, d: Deadline,
                        consume: Callable[[IO[bytes], Callable[[], CopyReport]], T]) -> T:
        """Streams a CopyFrom into consume, which reads the pieces as they arrive and then
        what roched left out (its trailers): nothing is held whole. When consume stops
        early (a cap, a refusal), the call is closed."""
        trailers: dict[str, list[str]] = {}
        messages = self.api.stream("CopyFrom", req, d, trailers)
        try:
            return await _aio.read_pieces(messages, _wire.tar_chunk,
                                          lambda r: consume(r, lambda: _wire.skipped_from_trailers(trailers)))
        finally:
            await messages.aclose()

    async def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None:
        tar = _tarutil.file_tar(_tarutil.base_name(path, "path"), data, mode)
        pieces = (tar[i:i + _wire.COPY_CHUNK] for i in range(0, len(tar), _wire.COPY_CHUNK))
        await self._upload(b"".join(_wire.copy_to_messages(sid, path, pieces)), d)

    async def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes:
        _tarutil.base_name(path, "path")
        cap = _tarutil.limit(max_bytes)
        return await self._download(_wire.copy_from_request(sid, path, max_bytes or 0), d,
                                    lambda r, skipped: _tarutil.file_from_tar(r, path, cap, skipped))

    async def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport:
        name = _tarutil.base_name(dst, "destination")
        cap = _tarutil.limit(max_bytes)
        if not os.path.lexists(src):
            raise SandboxNotFound(f"not found: host path {src} does not exist")
        rep = _tarutil.Report()
        messages = _wire.copy_to_messages(sid, dst, _tarutil.path_tar(src, name, cap, rep), max_bytes or 0)
        await self._upload(_aio.from_thread(messages), d)
        return rep.freeze()

    async def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                        preserve_links: bool = False) -> CopyReport:
        _tarutil.base_name(src, "source")
        cap = _tarutil.limit(max_bytes)
        where = posixpath.dirname(posixpath.normpath(src))
        return await self._download(_wire.copy_from_request(sid, src, max_bytes or 0, preserve_links), d,
                                    lambda r, skipped: _tarutil.extract(r, dst, cap, preserve_links, where, skipped))


    # The files API (sandbox.files): file content in binary protobuf, as it comes, both
    # ways; the rest in JSON.

    async def file_read(self, sid: str, path: str, d: Deadline,
                        max_bytes: Optional[int]) -> AsyncIterator[Union[EntryInfo, bytes]]:
        messages = self.api.stream_raw("ReadFile", _filesutil.read_request(sid, path, max_bytes or 0), d,
                                       _filesutil.PROTO_STREAM_HEADERS)
        try:
            async for raw in messages:
                entry, data = _filesutil.read_item(raw)
                if entry is not None:
                    yield entry
                if data:
                    yield data
        finally:
            await messages.aclose()

    async def file_write(self, sid: str, path: str, content: Any, mode: int, d: Deadline,
                         max_bytes: Optional[int]) -> EntryInfo:
        enc = _filesutil.WriteEncoder(sid, path, mode, max_bytes or 0)

        async def body() -> AsyncIterator[bytes]:
            async for piece in _aio.pieces(content):
                for m in enc.feed(piece):
                    yield m
            for m in enc.finish():
                yield m

        entry: Optional[EntryInfo] = None
        async for raw in self.api.stream_raw("WriteFile", body(), d, _filesutil.PROTO_STREAM_HEADERS):
            entry = _filesutil.write_response(raw)
        if entry is None:
            raise RocheError(f"roched on {self.api.ep.where} ended WriteFile without an answer")
        return entry

    async def file_list(self, sid: str, path: str, depth: int, d: Deadline) -> List[EntryInfo]:
        m = await self.api.unary("ListDir", {"sandboxId": sid, "path": path, "depth": depth}, d, retry=True)
        return [_filesutil.entry_from_json(e) for e in m.get("entries", [])]

    async def file_stat(self, sid: str, path: str, d: Deadline, missing_ok: bool = False) -> Optional[EntryInfo]:
        m = await self.api.unary("Stat", {"sandboxId": sid, "path": path, "missingOk": missing_ok}, d, retry=True)
        if missing_ok and not m.get("exists", False):
            return None
        return _filesutil.entry_from_json(m.get("entry"))

    async def file_mkdir(self, sid: str, path: str, d: Deadline) -> bool:
        m = await self.api.unary("MakeDir", {"sandboxId": sid, "path": path}, d)
        return bool(m.get("created", False))

    async def file_rename(self, sid: str, old: str, new: str, d: Deadline) -> EntryInfo:
        m = await self.api.unary("Rename", {"sandboxId": sid, "source": old, "destination": new}, d)
        return _filesutil.entry_from_json(m.get("entry"))

    async def file_remove(self, sid: str, path: str, d: Deadline) -> None:
        await self.api.unary("Remove", {"sandboxId": sid, "path": path}, d)

    async def file_watch(self, sid: str, path: str, recursive: bool, d: Deadline,
                         abort: _filesutil.Abort) -> AsyncIterator[Optional[FilesystemEvent]]:
        body = _wire.envelope({"sandboxId": sid, "path": path, "recursive": recursive})
        messages = self.api.stream_raw("WatchDir", body, d, _wire.STREAM_HEADERS, abort=abort)
        try:
            async for raw in messages:
                started, event = _filesutil.watch_item(json.loads(raw))
                if started:
                    yield None
                elif event is not None:
                    yield event
        finally:
            await messages.aclose()


class AsyncCLITransport:
    """The roche CLI (`roche --direct ... --json`) as a subprocess per call."""

    name = "cli"

    def __init__(self, cli: str) -> None:
        self.cli = cli
        self.holds = Holds()

    def close(self) -> None:
        _aio.let_go([h for h in self.holds.pop_all() if isinstance(h, CLIHold)])

    async def _run(self, args: list[str], d: Deadline, stdin: Optional[bytes] = None,
                   direct: bool = True) -> tuple[bytes, bytes, int]:
        p = await _aio.spawn(self.cli, args, stdin is not None, direct)
        return await p.communicate(stdin, d, f"roche {args[0]}")

    async def _call(self, args: list[str], d: Deadline) -> bytes:
        out, err, rc = await self._run(args, d)
        if rc != 0:
            raise _cli.error_from_stderr(err, rc, args[0])
        return out

    async def _roched(self, args: list[str], d: Deadline, stdin: Optional[bytes] = None) -> bytes:
        """A command only roched serves (the egress proxies, the secret store): the CLI
        without --direct, which asks the roched on its socket (ROCHE_SOCKET)."""
        out, err, rc = await self._run(args, d, stdin, direct=False)
        if rc != 0:
            raise _cli.error_from_stderr(err, rc, f"{args[0]} {args[1]}")
        return out

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if not cfg.leased:
            out = await self._call(_cli.create_args(provider, cfg), d)
            return _cli.parse_info(_cli.parse_json(out, "create"))
        # A plain subprocess, in both halves: it must outlive the event loop.
        h = CLIHold(self.cli, _cli.create_args(provider, cfg))
        try:
            info = await _aio.in_thread(h.first, d)
        except _aio.Cancelled:
            threading.Thread(target=h.stop, daemon=True).start()  # SIGTERM: roche undoes the create
            raise
        self.holds.add(info.id, h)
        return info

    async def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult:
        out, err, rc = await self._run(_cli.exec_args(sid, req, as_json=True), d, req.stdin)
        return _cli.result_or_error(out, err, rc)

    async def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]:
        started = time.monotonic()
        p = await _aio.spawn(self.cli, _cli.exec_args(sid, req, as_json=False), req.stdin is not None)
        parser = _cli.StreamParser()
        done = False
        try:
            if req.stdin is not None:
                p.feed(req.stdin)
            async for stream, data in p.output(d, "roche exec"):
                for event in parser.feed(stream, data):  # type: ignore[arg-type]
                    yield event
            rc = await p.wait(d, "roche exec")
            events, result = parser.finish(rc, time.monotonic() - started)
            done = True
            for event in events:
                yield event
            yield result
        finally:
            await p.close(stop=not done)

    async def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> AsyncIterator[_wire.CodeItem]:
        p = await _aio.spawn(self.cli, _cli.code_args(sid, req), True)
        parser = _cli.CodeEventParser()
        errbuf = bytearray()
        done = False
        try:
            p.feed(req.code.encode())
            async for stream, data in p.output(d, "roche code"):
                if stream == "stderr":
                    errbuf += data
                    continue
                for item in parser.feed(data):
                    yield item
            rc = await p.wait(d, "roche code")
            done = True
            parser.finish(bytes(errbuf), rc)
        finally:
            await p.close(stop=not done)

    async def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context:
        out = await self._call(_cli.context_create_args(sid, language, cwd), d)
        cid = _cli.first_line(out)
        if not cid:
            raise RocheError("roche context create printed no context id")
        return Context(cid, language or "python", cwd or "")

    async def contexts(self, sid: str, d: Deadline) -> List[Context]:
        return _cli.parse_contexts(await self._call(["context", "list", "--json", "--sandbox", sid], d))

    async def restart_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self._call(["context", "restart", "--sandbox", sid, cid], d)

    async def remove_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self._call(["context", "rm", "--sandbox", sid, cid], d)

    async def fork_context(self, sid: str, cid: str, d: Deadline) -> Context:
        fid = _cli.first_line(await self._call(["context", "fork", "--sandbox", sid, cid], d))
        if not fid:
            raise RocheError("roche context fork printed no context id")
        return next((c for c in await self.contexts(sid, d) if c.id == fid), Context(fid, "python", ""))

    async def start_command(self, sid: str, req: _cmdwire.CommandRequest, d: Deadline) -> CommandInfo:
        out = await self._call(_cmdwire.start_args(sid, req), d)
        return _cmdwire.parse_cli_command(_cli.parse_json(out, "exec --background"))

    async def connect_command(self, sid: str, sel: dict[str, Any], stdout_offset: int, stderr_offset: int,
                              d: Deadline) -> AsyncIterator[_cmdwire.Event]:
        p = await _aio.spawn(self.cli, _cmdwire.connect_args(sid, sel, stdout_offset, stderr_offset), False)
        errbuf, buf = bytearray(), bytearray()
        ended = False
        try:
            async for stream, data in p.output(d, "roche commands connect"):
                if stream == "stderr":
                    errbuf += data
                    continue
                buf += data
                while not ended and b"\n" in buf:
                    line, _, rest = bytes(buf).partition(b"\n")
                    buf = bytearray(rest)
                    ev = _cmdwire.cli_event(line)
                    if ev is not None:
                        ended = isinstance(ev, _cmdwire.Ended)
                        yield ev
            rc = await p.wait(d, "roche commands connect")
            if not ended:
                raise _cli.error_from_stderr(bytes(errbuf), rc, "commands connect")
        finally:
            await p.close(stop=not ended)

    async def list_commands(self, sid: str, d: Deadline) -> List[CommandInfo]:
        out = await self._call(_cmdwire.list_args(sid), d)
        return [_cmdwire.parse_cli_command(o) for o in _cli.parse_json(out, "commands list") or []]

    async def send_command_input(self, sid: str, sel: dict[str, Any], data: bytes, d: Deadline) -> None:
        out, err, rc = await self._run(_cmdwire.send_args(sid, sel), d, data)
        if rc != 0:
            raise _cli.error_from_stderr(err, rc, "commands send-stdin")

    async def close_command_input(self, sid: str, sel: dict[str, Any], d: Deadline) -> None:
        await self._call(_cmdwire.close_args(sid, sel), d)

    async def signal_command(self, sid: str, sel: dict[str, Any], sig: int, d: Deadline) -> None:
        await self._call(_cmdwire.signal_args(sid, sel, sig), d)

    async def destroy(self, sid: str, d: Deadline) -> None:
        h = self.holds.pop(sid)
        if isinstance(h, CLIHold):
            rc = await _aio.in_thread(h.finish, d)
            if rc is None:
                await _aio.in_thread(h.stop)
                raise d.expired("roche destroy")
            if rc == 0:
                return
            # It could not destroy the sandbox (or was stopped): destroy it as usual, for the error.
        try:
            await self._call(["destroy", sid], d)
        except SandboxNotFound:
            pass  # destroy is idempotent, as over the daemon

    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        for sb in await self.list(_cli.provider_of(sid), d):
            if sb.id == sid or (len(sid) >= 12 and sb.id.startswith(sid)):
                return sb
        raise SandboxNotFound(f"not found: no sandbox {sid} among yours (listing your sandboxes shows the live ones)")

    async def inspect_ended(self, sid: str, d: Deadline) -> SandboxInfo:
        # roche inspect: through roched, ended sandboxes too; directly, live ones only.
        out = await self._call(["inspect", "--json", sid], d)
        return _cli.parse_info(_cli.parse_json(out, "inspect"))

    async def list(self, provider: str, d: Deadline, metadata: Optional[Mapping[str, str]] = None,
                   state: Optional[str] = None) -> list[SandboxInfo]:
        out = await self._call(_cli.list_args(provider, metadata, state), d)
        return [_cli.parse_info(o) for o in _cli.parse_json(out, "list") or []]

    async def set_timeout(self, sid: str, seconds: int, d: Deadline) -> SandboxInfo:
        out = await self._call(["set-timeout", "--json", sid, str(seconds)], d)
        return _cli.parse_info(_cli.parse_json(out, "set-timeout"))

    async def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        await self._call(["pause" if pause else "unpause", sid], d)

    async def pause_to_disk(self, sid: str, d: Deadline) -> None:
        await self._call(["pause", "--to-disk", sid], d)

    async def resume(self, sid: str, d: Deadline) -> SandboxInfo:
        await self._call(["resume", sid], d)
        return await self.inspect(sid, d)

    async def fork(self, sid: str, count: int, d: Deadline) -> List[SandboxInfo]:
        out = await self._call(["fork", "-n", str(count), sid], d)
        ids = [line.strip() for line in out.decode().splitlines() if line.strip()]
        listed = {sb.id: sb for sb in await self.list(_cli.provider_of(sid), d)}
        missing = [i for i in ids if i not in listed]
        if missing:
            raise RocheError(f"roche fork made {', '.join(missing)}, which roche list does not show")
        return [listed[i] for i in ids]

    async def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        h = self.holds.get(sid)
        if not isinstance(h, CLIHold):
            out = await self._call(_cli.reset_args(sid, keep_workspace), d)
            return _cli.parse_info(_cli.parse_json(out, "reset"))
        try:
            info = await _aio.in_thread(h.reset, keep_workspace, d)
        except BaseException:
            if h.stopped:
                self.holds.pop(sid)
            raise
        self.holds.pop(sid)
        self.holds.add(info.id, h)
        return info

    async def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo:
        out = await self._call(_cli.snapshot_args(provider, sid, name), d)
        return _cli.parse_snapshot(_cli.parse_json(out, "snapshot create"))

    async def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]:
        out = await self._call(["snapshot", "list", "--json", "--provider", provider], d)
        return [_cli.parse_snapshot(o) for o in _cli.parse_json(out, "snapshot list") or []]

    async def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None:
        await self._call(["snapshot", "rm", "--provider", provider, name], d)

    async def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]:
        out = await self._call(["workspace", "list", "--json", "--provider", provider], d)
        return [_cli.parse_workspace(o) for o in _cli.parse_json(out, "workspace list") or []]

    async def delete_workspace(self, provider: str, name: str, d: Deadline) -> None:
        await self._call(["workspace", "rm", "--provider", provider, name], d)

    async def egress_log(self, sid: str, d: Deadline) -> List[EgressDecision]:
        out = await self._roched(["egress", "log", "--json", sid], d)
        return [_wire.parse_egress_decision(json.loads(line)) for line in out.splitlines() if line.strip()]

    async def egress_suggest(self, sid: str, d: Deadline) -> List[str]:
        out = await self._roched(["egress", "suggest", sid], d)
        return [line for line in out.decode().splitlines() if line.strip()]

    async def egress_policy(self, sid: str, allow: List[str], remove: List[str], d: Deadline) -> List[str]:
        out = b""
        if allow:
            out = await self._roched(["egress", "allow", sid, *allow], d)
        if remove:
            out = await self._roched(["egress", "deny", sid, *remove], d)
        return [line for line in out.decode().splitlines() if line.strip()]

    async def set_secret(self, name: str, value: str, sandbox: Optional[str], d: Deadline) -> List[str]:
        # The value goes on roche's standard input, never its command line (which any
        # local user can read in /proc); roche drops a trailing newline, which roched
        # would refuse (a control character), so one is refused here alike.
        if value.endswith(("\n", "\r")):
            raise InvalidConfig(f"invalid config: secret {name}: the value holds a control character, "
                                "which a request header cannot carry")
        args = ["secret", "set", name, *(["--sandbox", sandbox] if sandbox else [])]
        out = await self._roched(args, d, value.encode())
        return [line for line in out.decode().splitlines() if line.strip()]

    async def list_secrets(self, d: Deadline) -> List[StoredSecret]:
        out = await self._roched(["secret", "list", "--json"], d)
        return [_wire.parse_stored_secret(o) for o in _cli.parse_json(out, "secret list") or []]

    async def remove_secret(self, name: str, d: Deadline) -> None:
        await self._roched(["secret", "rm", name], d)

    async def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None:
        name = _tarutil.base_name(path, "path")
        with tempfile.TemporaryDirectory(prefix="roche-") as tmp:
            src = os.path.join(tmp, name)
            with open(src, "wb") as f:
                f.write(data)
            os.chmod(src, mode & 0o7777)
            await self._call(["cp", "-T", src, f"{sid}:{path}"], d)

    async def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes:
        _tarutil.base_name(path, "path")
        _tarutil.limit(max_bytes)
        with tempfile.TemporaryDirectory(prefix="roche-") as tmp:
            dst = os.path.join(tmp, "file")
            report = _cli.parse_copy_report(await self._call(_cli.cp_args(f"{sid}:{path}", dst, max_bytes, False), d))
            if not os.path.lexists(dst) and report.skipped_links:
                raise PermissionDenied(f"permission denied: {path} is a symlink, which the files API does not follow")
            if os.path.isdir(dst):
                raise InvalidConfig(f"invalid config: {path} is a directory: read_file reads files; use copy_from for directories")
            with open(dst, "rb") as f:
                return f.read()

    async def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport:
        _tarutil.base_name(dst, "destination")
        _tarutil.limit(max_bytes)
        if not os.path.lexists(src):
            raise SandboxNotFound(f"not found: host path {src} does not exist")
        return _cli.parse_copy_report(await self._call(_cli.cp_args(src, f"{sid}:{dst}", max_bytes, False), d))

    async def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                        preserve_links: bool = False) -> CopyReport:
        _tarutil.base_name(src, "source")
        _tarutil.limit(max_bytes)
        return _cli.parse_copy_report(await self._call(_cli.cp_args(f"{sid}:{src}", dst, max_bytes, preserve_links), d))

    # The files API (sandbox.files), through `roche files`: content streamed through
    # the CLI's standard input and output.

    async def file_read(self, sid: str, path: str, d: Deadline,
                        max_bytes: Optional[int]) -> AsyncIterator[Union[EntryInfo, bytes]]:
        p = await _aio.spawn(self.cli, _filesutil.cli_read_args(sid, path, max_bytes), False)
        errbuf = bytearray()
        done = False
        try:
            async for stream, data in p.output(d, "roche files cat"):
                if stream == "stderr":
                    errbuf += data
                else:
                    yield data
            rc = await p.wait(d, "roche files cat")
            done = True
            if rc != 0:
                raise _cli.error_from_stderr(bytes(errbuf), rc, "files cat")
        finally:
            await p.close(stop=not done)

    async def file_write(self, sid: str, path: str, content: Any, mode: int, d: Deadline,
                         max_bytes: Optional[int]) -> EntryInfo:
        p = await _aio.spawn(self.cli, _filesutil.cli_write_args(sid, path, mode, max_bytes), True)
        out, errbuf = bytearray(), bytearray()
        done = False
        try:
            p.feed_from(_aio.pieces(content))
            async for stream, data in p.output(d, "roche files write"):
                if stream == "stderr":
                    errbuf += data
                else:
                    out += data
            rc = await p.wait(d, "roche files write")
            done = True
            await p.fed()
            if rc != 0:
                raise _cli.error_from_stderr(bytes(errbuf), rc, "files write")
        finally:
            await p.close(stop=not done)
        return _filesutil.entry_from_cli(_cli.parse_json(bytes(out), "files write"))

    async def file_list(self, sid: str, path: str, depth: int, d: Deadline) -> List[EntryInfo]:
        out = await self._call(["files", "ls", "--json", "--depth", str(depth), sid, path], d)
        return _filesutil.entries_from_cli(out)

    async def file_stat(self, sid: str, path: str, d: Deadline, missing_ok: bool = False) -> Optional[EntryInfo]:
        if missing_ok:
            out = await self._call(["files", "exists", sid, path], d)
            if _cli.first_line(out) != "true":
                return None
        out = await self._call(["files", "stat", "--json", sid, path], d)
        return _filesutil.entry_from_cli(_cli.parse_json(out, "files stat"))

    async def file_mkdir(self, sid: str, path: str, d: Deadline) -> bool:
        out = await self._call(["files", "mkdir", "--json", sid, path], d)
        return bool(_cli.parse_json(out, "files mkdir").get("created", False))

    async def file_rename(self, sid: str, old: str, new: str, d: Deadline) -> EntryInfo:
        out = await self._call(["files", "mv", "--json", sid, old, new], d)
        return _filesutil.entry_from_cli(_cli.parse_json(out, "files mv"))

    async def file_remove(self, sid: str, path: str, d: Deadline) -> None:
        await self._call(["files", "rm", sid, path], d)

    async def file_watch(self, sid: str, path: str, recursive: bool, d: Deadline,
                         abort: _filesutil.Abort) -> AsyncIterator[Optional[FilesystemEvent]]:
        args = ["files", "watch", "--json"] + (["--recursive"] if recursive else []) + [sid, path]
        p = await _aio.spawn(self.cli, args, False)
        abort.set(p.terminate)
        line, errbuf = bytearray(), bytearray()
        done = False
        try:
            async for stream, data in p.output(d, "roche files watch"):
                if stream == "stderr":
                    errbuf += data
                    continue
                line += data
                while b"\n" in line:
                    one, _, rest = bytes(line).partition(b"\n")
                    line = bytearray(rest)
                    started, event = _filesutil.event_from_cli(one)
                    if started:
                        yield None
                    elif event is not None:
                        yield event
            rc = await p.wait(d, "roche files watch")
            done = True
            if rc != 0:
                raise _cli.error_from_stderr(bytes(errbuf), rc, "files watch")
        finally:
            await p.close(stop=not done)
