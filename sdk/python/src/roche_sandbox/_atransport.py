"""The async API's two ways to Roche: roched over asyncio streams, or the roche CLI as an
asyncio subprocess. Cancelling a call ends it there too (the connection is closed, or
the CLI is stopped), so a cancelled exec kills its command."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import signal
import tempfile
import threading
import time
# typing.List: inside these classes "list" names their list() method.
from typing import IO, AsyncIterator, Callable, Iterator, List, Optional, Protocol, TypeVar

from . import _cli, _tarutil, _wire
from ._ahttp import AsyncHTTPClient, within
from ._discovery import Endpoint
from ._http import Deadline
from ._lease import CLIHold, DaemonHold, Holds
from ._transport import UNDO_TIMEOUT, StreamItem, _provider_of
from .errors import InvalidConfig, PermissionDenied, ProviderUnavailable, RocheError, SandboxNotFound
from .types import CodeRequest, Context, CopyReport, ExecRequest, ExecResult, Execution, SandboxConfig, SandboxInfo, SnapshotInfo, WorkspaceInfo


class AsyncTransport(Protocol):
    """What an AsyncSandbox needs from its way to Roche."""

    name: str

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo: ...
    async def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult: ...
    def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]: ...
    async def destroy(self, sid: str, d: Deadline) -> None: ...
    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo: ...
    async def list(self, provider: str, d: Deadline) -> list[SandboxInfo]: ...
    async def pause(self, sid: str, pause: bool, d: Deadline) -> None: ...
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
    def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> AsyncIterator[_wire.CodeItem]: ...
    async def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context: ...
    async def contexts(self, sid: str, d: Deadline) -> List[Context]: ...
    async def restart_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    async def remove_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    def close(self) -> None: ...


class AsyncDaemonTransport:
    """roched's API, the Connect protocol in JSON, over asyncio streams."""

    name = "daemon"

    def __init__(self, ep: Endpoint) -> None:
        self.http = AsyncHTTPClient(ep)
        self.holds = Holds()
        self._leases: Optional[dict[str, bool]] = None

    def close(self) -> None:
        for h in self.holds.pop_all():
            h.release()
        self.http.close()

    async def _provider_leases(self, provider: str, d: Deadline) -> bool:
        """Whether roched takes leased=true for the provider (asked once)."""
        if self._leases is None:
            self._leases = _wire.leases(await self.http.unary("ListProviders", {}, d))
        return self._leases.get(provider, False)

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if cfg.leased and not await self._provider_leases(provider, d):
            cfg = dataclasses.replace(cfg, leased=False)  # a roched without leases: as before them
        m = await self.http.unary("Create", _wire.config_request(provider, cfg), d)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        if cfg.leased:
            await self._hold(info.id, d)
        return info

    async def _hold(self, sid: str, d: Deadline) -> None:
        """Holds a leased sandbox just made (from a thread, see _lease); one that cannot
        be held is destroyed."""
        h = DaemonHold(self.http.ep, sid)
        try:
            await asyncio.to_thread(h.start, d)
        except asyncio.CancelledError:
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
        m = await self.http.unary("Exec", _wire.exec_request(sid, req), d)
        return _wire.parse_result(m.get("result", {}))

    async def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]:
        out = _wire.OutputAssembler()
        messages = self.http.stream("ExecStream", _wire.envelope(_wire.exec_request(sid, req)), d)
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
        messages = self.http.stream("RunCode", _wire.envelope(_wire.code_request(sid, req)), d)
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
        return _wire.parse_context((await self.http.unary("CreateContext", m, d)).get("context"))

    async def contexts(self, sid: str, d: Deadline) -> List[Context]:
        m = await self.http.unary("ListContexts", {"sandboxId": sid}, d)
        return [_wire.parse_context(c) for c in m.get("contexts", [])]

    async def restart_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self.http.unary("RestartContext", {"sandboxId": sid, "contextId": cid}, d)

    async def remove_context(self, sid: str, cid: str, d: Deadline) -> None:
        await self.http.unary("RemoveContext", {"sandboxId": sid, "contextId": cid}, d)

    async def destroy(self, sid: str, d: Deadline) -> None:
        try:
            await self.http.unary("Destroy", {"ids": [sid]}, d)
        except SandboxNotFound:
            pass  # roched serves no such sandbox (any more): destroy is idempotent
        finally:
            # Let go after the Destroy: one that failed still ends, when the hold does.
            h = self.holds.pop(sid)
            if h is not None:
                h.release()

    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        m = await self.http.unary("Inspect", {"sandboxId": sid}, d)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    async def list(self, provider: str, d: Deadline) -> list[SandboxInfo]:
        m = await self.http.unary("List", {"provider": provider}, d)
        return [_wire.parse_sandbox(s) for s in m.get("sandboxes", [])]

    async def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        await self.http.unary("Pause" if pause else "Unpause", {"sandboxId": sid}, d)

    async def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        m = await self.http.unary("Reset", {"sandboxId": sid, "wipeWorkspace": not keep_workspace}, d)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        old = self.holds.pop(sid)
        if old is not None:
            # roched keeps the lease for the new sandbox and waits for its first Hold.
            old.release()
            await self._hold(info.id, d)
        return info

    async def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo:
        m = await self.http.unary("CreateSnapshot", {"sandboxId": sid, "name": name}, d)
        return _wire.parse_snapshot(m.get("snapshot", {}))

    async def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]:
        m = await self.http.unary("ListSnapshots", {"provider": provider}, d)
        return [_wire.parse_snapshot(s) for s in m.get("snapshots", [])]

    async def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None:
        await self.http.unary("RemoveSnapshot", {"name": name, "provider": provider}, d)

    async def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]:
        m = await self.http.unary("ListWorkspaces", {"provider": provider}, d)
        return [_wire.parse_workspace(w) for w in m.get("workspaces", [])]

    async def delete_workspace(self, provider: str, name: str, d: Deadline) -> None:
        await self.http.unary("RemoveWorkspace", {"name": name, "provider": provider}, d)

    async def _upload(self, body: object, d: Deadline) -> None:
        messages = self.http.stream("CopyTo", body, d)
        async for _ in messages:
            pass

    async def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None:
        tar = _tarutil.file_tar(_tarutil.base_name(path, "path"), data, mode)
        pieces = (tar[i:i + _wire.COPY_CHUNK] for i in range(0, len(tar), _wire.COPY_CHUNK))
        await self._upload(b"".join(_wire.copy_to_messages(sid, path, pieces)), d)

    async def _download(self, req: bytes, d: Deadline,
                        consume: Callable[[IO[bytes], dict[str, list[str]]], T]) -> T:
        """Streams a CopyFrom into consume, which runs in a worker thread and reads the
        pieces as they arrive: nothing is held whole. When consume stops early (a cap,
        a refusal), the call is closed."""
        trailers: dict[str, list[str]] = {}
        reader = _tarutil.PipeReader()

        def run() -> T:
            try:
                return consume(reader, trailers)
            finally:
                reader.abandoned.set()

        work = asyncio.ensure_future(asyncio.to_thread(run))
        messages = self.http.stream("CopyFrom", req, d, trailers)
        try:
            async for m in messages:
                await asyncio.to_thread(reader.feed, _wire.tar_chunk(m))
            await asyncio.to_thread(reader.feed, None)
        except _tarutil.Abandoned:
            pass  # consume is done, early or refusing: its result says which
        except BaseException as e:
            reader.fail(e if isinstance(e, Exception) else RocheError("the copy was cancelled"))
            # The worker ends at its next read; its own error is this one's consequence.
            work.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        finally:
            await messages.aclose()
        return await work

    async def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes:
        _tarutil.base_name(path, "path")
        cap = _tarutil.limit(max_bytes)
        return await self._download(
            _wire.copy_from_request(sid, path, max_bytes or 0), d,
            lambda r, tr: _tarutil.file_from_tar(r, path, cap, lambda: _wire.skipped_from_trailers(tr)))

    async def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport:
        name = _tarutil.base_name(dst, "destination")
        cap = _tarutil.limit(max_bytes)
        if not os.path.lexists(src):
            raise SandboxNotFound(f"not found: host path {src} does not exist")
        rep = _tarutil.Report()
        messages = _wire.copy_to_messages(sid, dst, _tarutil.path_tar(src, name, cap, rep), max_bytes or 0)
        await self._upload(_from_thread(messages), d)
        return rep.freeze()

    async def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                        preserve_links: bool = False) -> CopyReport:
        _tarutil.base_name(src, "source")
        cap = _tarutil.limit(max_bytes)
        where = posixpath.dirname(posixpath.normpath(src))
        return await self._download(
            _wire.copy_from_request(sid, src, max_bytes or 0, preserve_links), d,
            lambda r, tr: _tarutil.extract(r, dst, cap, preserve_links, where, lambda: _wire.skipped_from_trailers(tr)))


T = TypeVar("T")


async def _from_thread(gen: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The pieces of a generator that reads files, each made in a worker thread so the
    event loop never waits on the disk."""
    while True:
        piece = await asyncio.to_thread(next, gen, None)
        if piece is None:
            return
        yield piece


class AsyncCLITransport:
    """The roche CLI (`roche --direct ... --json`) as an asyncio subprocess per call."""

    name = "cli"

    def __init__(self, cli: str) -> None:
        self.cli = cli
        self.holds = Holds()

    def close(self) -> None:
        # Not waited for here (close is not async): each roche destroys its sandbox and is
        # reaped by a thread.
        for h in self.holds.pop_all():
            if isinstance(h, CLIHold):
                h.reap_in_background()

    async def _spawn(self, args: list[str], stdin: bool) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                self.cli, "--direct", *args,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            raise ProviderUnavailable(
                f"cannot run the roche CLI {self.cli!r}: {e}: put roche on PATH or set ROCHE_CLI"
            ) from None

    async def _run(self, args: list[str], d: Deadline, stdin: Optional[bytes] = None) -> tuple[bytes, bytes, int]:
        p = await self._spawn(args, stdin is not None)
        try:
            out, err = await within(d, p.communicate(stdin), f"roche {args[0]}")
        except BaseException:
            await stop(p)
            raise
        return out, err, p.returncode if p.returncode is not None else -1

    async def _call(self, args: list[str], d: Deadline) -> bytes:
        out, err, rc = await self._run(args, d)
        if rc != 0:
            raise _cli.error_from_stderr(err, rc, args[0])
        return out

    async def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if not cfg.leased:
            out = await self._call(_cli.create_args(provider, cfg), d)
            return _cli.parse_info(_cli.parse_json(out, "create"))
        # A plain subprocess, not an asyncio one: it must outlive the event loop.
        h = CLIHold(self.cli, _cli.create_args(provider, cfg))
        try:
            info = await asyncio.to_thread(h.first, d)
        except asyncio.CancelledError:
            threading.Thread(target=h.stop, daemon=True).start()  # SIGTERM: roche undoes the create
            raise
        self.holds.add(info.id, h)
        return info

    async def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult:
        out, err, rc = await self._run(_cli.exec_args(sid, req, as_json=True), d, req.stdin)
        return _cli.result_or_error(out, err, rc)

    async def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> AsyncIterator[StreamItem]:
        started = time.monotonic()
        p = await self._spawn(_cli.exec_args(sid, req, as_json=False), req.stdin is not None)
        parser = _cli.StreamParser()
        readers: dict[asyncio.Future[bytes], str] = {}
        feeder: Optional[asyncio.Task[None]] = None
        done = False
        try:
            if p.stdin is not None:
                feeder = asyncio.ensure_future(_feed(p.stdin, req.stdin or b""))
            assert p.stdout is not None and p.stderr is not None
            pipes = {"stdout": p.stdout, "stderr": p.stderr}
            for name, pipe in pipes.items():
                readers[asyncio.ensure_future(pipe.read(65536))] = name
            while readers:
                ready, _ = await within(d, asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED), "roche exec")
                for fut in ready:
                    name = readers.pop(fut)
                    data = fut.result()
                    if data:
                        readers[asyncio.ensure_future(pipes[name].read(65536))] = name
                        for event in parser.feed(name, data):  # type: ignore[arg-type]
                            yield event
            rc = await within(d, p.wait(), "roche exec")
            events, result = parser.finish(rc, time.monotonic() - started)
            done = True
            for event in events:
                yield event
            yield result
        finally:
            for fut in readers:
                fut.cancel()
            if feeder is not None:
                feeder.cancel()
            if not done:
                await stop(p)

    async def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> AsyncIterator[_wire.CodeItem]:
        p = await self._spawn(_cli.code_args(sid, req), True)
        parser = _cli.CodeEventParser()
        errbuf = bytearray()
        readers: dict[asyncio.Future[bytes], str] = {}
        feeder: Optional[asyncio.Task[None]] = None
        done = False
        try:
            assert p.stdin is not None and p.stdout is not None and p.stderr is not None
            feeder = asyncio.ensure_future(_feed(p.stdin, req.code.encode()))
            pipes = {"stdout": p.stdout, "stderr": p.stderr}
            for name, pipe in pipes.items():
                readers[asyncio.ensure_future(pipe.read(65536))] = name
            while readers:
                ready, _ = await within(d, asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED), "roche code")
                for fut in ready:
                    name = readers.pop(fut)
                    data = fut.result()
                    if not data:
                        continue
                    readers[asyncio.ensure_future(pipes[name].read(65536))] = name
                    if name == "stderr":
                        errbuf += data
                        continue
                    for item in parser.feed(data):
                        yield item
            rc = await within(d, p.wait(), "roche code")
            done = True
            parser.finish(bytes(errbuf), rc)
        finally:
            for fut in readers:
                fut.cancel()
            if feeder is not None:
                feeder.cancel()
            if not done:
                await stop(p)

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

    async def destroy(self, sid: str, d: Deadline) -> None:
        h = self.holds.pop(sid)
        if isinstance(h, CLIHold):
            rc = await asyncio.to_thread(h.finish, d)
            if rc is None:
                await asyncio.to_thread(h.stop)
                raise d.expired("roche destroy")
            if rc == 0:
                return
            # It could not destroy the sandbox (or was stopped): destroy it as usual, for the error.
        try:
            await self._call(["destroy", sid], d)
        except SandboxNotFound:
            pass  # destroy is idempotent, as over the daemon

    async def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        for sb in await self.list(_provider_of(sid), d):
            if sb.id == sid or (len(sid) >= 12 and sb.id.startswith(sid)):
                return sb
        raise SandboxNotFound(f"not found: no sandbox {sid} (roche list shows the live ones)")

    async def list(self, provider: str, d: Deadline) -> list[SandboxInfo]:
        obj = _cli.parse_json(await self._call(["list", "--json", "--provider", provider], d), "list")
        return [_cli.parse_info(o) for o in obj or []]

    async def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        await self._call(["pause" if pause else "unpause", sid], d)

    async def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        h = self.holds.get(sid)
        if not isinstance(h, CLIHold):
            out = await self._call(_cli.reset_args(sid, keep_workspace), d)
            return _cli.parse_info(_cli.parse_json(out, "reset"))
        try:
            info = await asyncio.to_thread(h.reset, keep_workspace, d)
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


async def _feed(w: asyncio.StreamWriter, data: bytes) -> None:
    try:
        w.write(data)
        await w.drain()
        w.close()
    except (OSError, RuntimeError):
        pass


async def stop(p: asyncio.subprocess.Process) -> None:
    """Ends a CLI process: SIGTERM first, so that it cleans up (kills the command it
    runs, destroys a half-made sandbox), then SIGKILL."""
    if p.returncode is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        await asyncio.wait_for(asyncio.shield(p.wait()), 10)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        try:
            p.kill()
        except ProcessLookupError:
            pass
        await p.wait()
