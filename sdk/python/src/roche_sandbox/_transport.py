"""The two ways the synchronous API reaches Roche: roched over HTTP, or the roche CLI as
a subprocess. Both offer the same calls and raise the same typed exceptions."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import selectors
import signal
import subprocess
import tempfile
import threading
import time
# typing.List: inside these classes "list" names their list() method.
from typing import Iterator, List, Optional, Protocol, Union

from . import _cli, _tarutil, _wire
from ._discovery import Endpoint
from ._http import Deadline, HTTPClient
from ._lease import CLIHold, DaemonHold, Holds
from .errors import InvalidConfig, PermissionDenied, ProviderUnavailable, RocheError, SandboxNotFound
from .types import CodeRequest, Context, CopyReport, ExecRequest, ExecResult, Execution, OutputEvent, SandboxConfig, SandboxInfo, SnapshotInfo, WorkspaceInfo

StreamItem = Union[OutputEvent, ExecResult]

#: How long undoing a half-done call, or letting go at close(), may take.
UNDO_TIMEOUT = 20.0


class Transport(Protocol):
    """What a Sandbox needs from its way to Roche."""

    name: str

    def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo: ...
    def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult: ...
    def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> Iterator[StreamItem]: ...
    def destroy(self, sid: str, d: Deadline) -> None: ...
    def inspect(self, sid: str, d: Deadline) -> SandboxInfo: ...
    def list(self, provider: str, d: Deadline) -> list[SandboxInfo]: ...
    def pause(self, sid: str, pause: bool, d: Deadline) -> None: ...
    def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None: ...
    def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes: ...
    def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport: ...
    def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                  preserve_links: bool = False) -> CopyReport: ...
    def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo: ...
    def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo: ...
    def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]: ...
    def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None: ...
    def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]: ...
    def delete_workspace(self, provider: str, name: str, d: Deadline) -> None: ...
    def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> Iterator[_wire.CodeItem]: ...
    def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context: ...
    def contexts(self, sid: str, d: Deadline) -> List[Context]: ...
    def restart_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    def remove_context(self, sid: str, cid: str, d: Deadline) -> None: ...
    def close(self) -> None: ...


class DaemonTransport:
    """roched's API, the Connect protocol in JSON."""

    name = "daemon"

    def __init__(self, ep: Endpoint) -> None:
        self.http = HTTPClient(ep)
        self.holds = Holds()
        self._leases: Optional[dict[str, bool]] = None

    def close(self) -> None:
        for h in self.holds.pop_all():
            h.release()
        self.http.close()

    def _provider_leases(self, provider: str, d: Deadline) -> bool:
        """Whether roched takes leased=true for the provider (asked once)."""
        if self._leases is None:
            self._leases = _wire.leases(self.http.unary("ListProviders", {}, d))
        return self._leases.get(provider, False)

    def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if cfg.leased and not self._provider_leases(provider, d):
            cfg = dataclasses.replace(cfg, leased=False)  # a roched without leases: as before them
        m = self.http.unary("Create", _wire.config_request(provider, cfg), d)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        if cfg.leased:
            self._hold(info.id, d)
        return info

    def _hold(self, sid: str, d: Deadline) -> None:
        """Holds a leased sandbox just made; one that cannot be held is destroyed."""
        h = DaemonHold(self.http.ep, sid)
        try:
            h.start(d)
        except BaseException:
            try:
                self.destroy(sid, Deadline(UNDO_TIMEOUT))
            except RocheError:
                pass  # not held, roched destroys it shortly anyway
            raise
        self.holds.add(sid, h)

    def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult:
        m = self.http.unary("Exec", _wire.exec_request(sid, req), d)
        return _wire.parse_result(m.get("result", {}))

    def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> Iterator[StreamItem]:
        out = _wire.OutputAssembler()
        body = _wire.envelope(_wire.exec_request(sid, req))
        for m in self.http.stream("ExecStream", body, d):
            event, result = _wire.stream_event(m, out)
            if event is not None:
                yield event
            if result is not None:
                yield result
                return
        raise RocheError("roched ended the output stream without a result")

    def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> Iterator[_wire.CodeItem]:
        asm = _wire.CodeAssembler()
        for m in self.http.stream("RunCode", _wire.envelope(_wire.code_request(sid, req)), d):
            item = _wire.code_event(m, asm)
            if item is not None:
                yield item
                if isinstance(item, Execution):
                    return
        raise RocheError("roched ended the code stream without an execution")

    def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context:
        m: dict[str, object] = {"sandboxId": sid}
        if language:
            m["language"] = language
        if cwd:
            m["cwd"] = cwd
        return _wire.parse_context(self.http.unary("CreateContext", m, d).get("context"))

    def contexts(self, sid: str, d: Deadline) -> List[Context]:
        m = self.http.unary("ListContexts", {"sandboxId": sid}, d)
        return [_wire.parse_context(c) for c in m.get("contexts", [])]

    def restart_context(self, sid: str, cid: str, d: Deadline) -> None:
        self.http.unary("RestartContext", {"sandboxId": sid, "contextId": cid}, d)

    def remove_context(self, sid: str, cid: str, d: Deadline) -> None:
        self.http.unary("RemoveContext", {"sandboxId": sid, "contextId": cid}, d)

    def destroy(self, sid: str, d: Deadline) -> None:
        try:
            self.http.unary("Destroy", {"ids": [sid]}, d)
        except SandboxNotFound:
            pass  # roched serves no such sandbox (any more): destroy is idempotent
        finally:
            # Let go after the Destroy: one that failed still ends, when the hold does.
            h = self.holds.pop(sid)
            if h is not None:
                h.release()

    def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        m = self.http.unary("Inspect", {"sandboxId": sid}, d)
        return _wire.parse_sandbox(m.get("sandbox", {}))

    def list(self, provider: str, d: Deadline) -> list[SandboxInfo]:
        m = self.http.unary("List", {"provider": provider}, d)
        return [_wire.parse_sandbox(s) for s in m.get("sandboxes", [])]

    def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        self.http.unary("Pause" if pause else "Unpause", {"sandboxId": sid}, d)

    def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        m = self.http.unary("Reset", {"sandboxId": sid, "wipeWorkspace": not keep_workspace}, d)
        info = _wire.parse_sandbox(m.get("sandbox", {}))
        old = self.holds.pop(sid)
        if old is not None:
            # roched keeps the lease for the new sandbox and waits for its first Hold.
            old.release()
            self._hold(info.id, d)
        return info

    def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo:
        m = self.http.unary("CreateSnapshot", {"sandboxId": sid, "name": name}, d)
        return _wire.parse_snapshot(m.get("snapshot", {}))

    def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]:
        m = self.http.unary("ListSnapshots", {"provider": provider}, d)
        return [_wire.parse_snapshot(s) for s in m.get("snapshots", [])]

    def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None:
        self.http.unary("RemoveSnapshot", {"name": name, "provider": provider}, d)

    def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]:
        m = self.http.unary("ListWorkspaces", {"provider": provider}, d)
        return [_wire.parse_workspace(w) for w in m.get("workspaces", [])]

    def delete_workspace(self, provider: str, name: str, d: Deadline) -> None:
        self.http.unary("RemoveWorkspace", {"name": name, "provider": provider}, d)

    def _upload(self, sid: str, dst: str, pieces: Iterator[bytes], d: Deadline, body_bytes: bool,
                max_bytes: int = 0) -> None:
        messages = _wire.copy_to_messages(sid, dst, pieces, max_bytes)
        body: object = b"".join(messages) if body_bytes else messages
        for _ in self.http.stream("CopyTo", body, d):
            pass

    def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None:
        tar = _tarutil.file_tar(_tarutil.base_name(path, "path"), data, mode)
        pieces = (tar[i:i + _wire.COPY_CHUNK] for i in range(0, len(tar), _wire.COPY_CHUNK))
        self._upload(sid, path, pieces, d, body_bytes=True)

    def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes:
        _tarutil.base_name(path, "path")
        cap = _tarutil.limit(max_bytes)
        trailers: dict[str, list[str]] = {}
        messages = self.http.stream("CopyFrom", _wire.copy_from_request(sid, path, max_bytes or 0), d, trailers)
        try:
            return _tarutil.file_from_tar(_tarutil.ChunkReader(_wire.tar_chunk(m) for m in messages), path, cap,
                                          lambda: _wire.skipped_from_trailers(trailers))
        finally:
            messages.close()

    def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport:
        name = _tarutil.base_name(dst, "destination")
        cap = _tarutil.limit(max_bytes)
        if not os.path.lexists(src):
            raise SandboxNotFound(f"not found: host path {src} does not exist")
        rep = _tarutil.Report()
        self._upload(sid, dst, _tarutil.path_tar(src, name, cap, rep), d, body_bytes=False, max_bytes=max_bytes or 0)
        return rep.freeze()

    def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                  preserve_links: bool = False) -> CopyReport:
        _tarutil.base_name(src, "source")
        cap = _tarutil.limit(max_bytes)
        trailers: dict[str, list[str]] = {}
        messages = self.http.stream("CopyFrom", _wire.copy_from_request(sid, src, max_bytes or 0, preserve_links), d, trailers)
        try:
            return _tarutil.extract(_tarutil.ChunkReader(_wire.tar_chunk(m) for m in messages), dst, cap, preserve_links,
                                    posixpath.dirname(posixpath.normpath(src)), lambda: _wire.skipped_from_trailers(trailers))
        finally:
            messages.close()


class CLITransport:
    """The roche CLI (`roche --direct ... --json`) as a subprocess per call."""

    name = "cli"

    def __init__(self, cli: str) -> None:
        self.cli = cli
        self.holds = Holds()

    def close(self) -> None:
        held = [h for h in self.holds.pop_all() if isinstance(h, CLIHold)]
        for h in held:
            h.release()
        d = Deadline(UNDO_TIMEOUT)
        for h in held:
            if h.finish(d) is None:
                h.reap_in_background()

    def _popen(self, args: list[str], stdin: bool) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen([self.cli, "--direct", *args],
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise ProviderUnavailable(
                f"cannot run the roche CLI {self.cli!r}: {e}: put roche on PATH or set ROCHE_CLI"
            ) from None

    def _run(self, args: list[str], d: Deadline, stdin: Optional[bytes] = None) -> tuple[bytes, bytes, int]:
        p = self._popen(args, stdin is not None)
        try:
            out, err = p.communicate(stdin, timeout=d.remaining())
        except subprocess.TimeoutExpired:
            stop(p)
            raise d.expired(f"roche {args[0]}") from None
        except BaseException:
            stop(p)
            raise
        return out, err, p.returncode

    def _call(self, args: list[str], d: Deadline) -> bytes:
        out, err, rc = self._run(args, d)
        if rc != 0:
            raise _cli.error_from_stderr(err, rc, args[0])
        return out

    def create(self, provider: str, cfg: SandboxConfig, d: Deadline) -> SandboxInfo:
        if not cfg.leased:
            return _cli.parse_info(_cli.parse_json(self._call(_cli.create_args(provider, cfg), d), "create"))
        h = CLIHold(self.cli, _cli.create_args(provider, cfg))
        info = h.first(d)
        self.holds.add(info.id, h)
        return info

    def exec(self, sid: str, req: ExecRequest, d: Deadline) -> ExecResult:
        out, err, rc = self._run(_cli.exec_args(sid, req, as_json=True), d, req.stdin)
        return _cli.result_or_error(out, err, rc)

    def exec_stream(self, sid: str, req: ExecRequest, d: Deadline) -> Iterator[StreamItem]:
        started = time.monotonic()
        p = self._popen(_cli.exec_args(sid, req, as_json=False), req.stdin is not None)
        parser = _cli.StreamParser()
        sel = selectors.DefaultSelector()
        done = False
        try:
            if p.stdin is not None:
                # Written from a thread: a pipe holds 64 KiB, and the output must be read meanwhile.
                _feed_stdin(p, req.stdin or b"")
            assert p.stdout is not None and p.stderr is not None
            sel.register(p.stdout, selectors.EVENT_READ, "stdout")
            sel.register(p.stderr, selectors.EVENT_READ, "stderr")
            open_streams = 2
            while open_streams:
                left = d.remaining()
                if left is not None and left <= 0:
                    raise d.expired("roche exec")
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    yield from parser.feed(key.data, data)
            try:
                rc = p.wait(timeout=d.remaining())
            except subprocess.TimeoutExpired:
                raise d.expired("roche exec") from None
            events, result = parser.finish(rc, time.monotonic() - started)
            done = True
            yield from events
            yield result
        finally:
            sel.close()
            if not done:
                stop(p)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()

    def run_code(self, sid: str, req: CodeRequest, d: Deadline) -> Iterator[_wire.CodeItem]:
        p = self._popen(_cli.code_args(sid, req), True)
        parser = _cli.CodeEventParser()
        errbuf = bytearray()
        sel = selectors.DefaultSelector()
        done = False
        try:
            _feed_stdin(p, req.code.encode())
            assert p.stdout is not None and p.stderr is not None
            sel.register(p.stdout, selectors.EVENT_READ, "stdout")
            sel.register(p.stderr, selectors.EVENT_READ, "stderr")
            open_streams = 2
            while open_streams:
                left = d.remaining()
                if left is not None and left <= 0:
                    raise d.expired("roche code")
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.data == "stderr":
                        errbuf += data
                    else:
                        yield from parser.feed(data)
            try:
                rc = p.wait(timeout=d.remaining())
            except subprocess.TimeoutExpired:
                raise d.expired("roche code") from None
            done = True
            parser.finish(bytes(errbuf), rc)
        finally:
            sel.close()
            if not done:
                stop(p)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()

    def create_context(self, sid: str, language: str, cwd: Optional[str], d: Deadline) -> Context:
        out = self._call(_cli.context_create_args(sid, language, cwd), d)
        cid = _cli.first_line(out)
        if not cid:
            raise RocheError("roche context create printed no context id")
        return Context(cid, language or "python", cwd or "")

    def contexts(self, sid: str, d: Deadline) -> List[Context]:
        return _cli.parse_contexts(self._call(["context", "list", "--json", "--sandbox", sid], d))

    def restart_context(self, sid: str, cid: str, d: Deadline) -> None:
        self._call(["context", "restart", "--sandbox", sid, cid], d)

    def remove_context(self, sid: str, cid: str, d: Deadline) -> None:
        self._call(["context", "rm", "--sandbox", sid, cid], d)

    def destroy(self, sid: str, d: Deadline) -> None:
        h = self.holds.pop(sid)
        if isinstance(h, CLIHold):
            rc = h.finish(d)
            if rc is None:
                h.stop()
                raise d.expired("roche destroy")
            if rc == 0:
                return
            # It could not destroy the sandbox (or was stopped): destroy it as usual, for the error.
        try:
            self._call(["destroy", sid], d)
        except SandboxNotFound:
            pass  # destroy is idempotent, as over the daemon

    def inspect(self, sid: str, d: Deadline) -> SandboxInfo:
        provider = _provider_of(sid)
        for sb in self.list(provider, d):
            if sb.id == sid or (len(sid) >= 12 and sb.id.startswith(sid)):
                return sb
        raise SandboxNotFound(f"not found: no sandbox {sid} (roche list shows the live ones)")

    def list(self, provider: str, d: Deadline) -> list[SandboxInfo]:
        obj = _cli.parse_json(self._call(["list", "--json", "--provider", provider], d), "list")
        return [_cli.parse_info(o) for o in obj or []]

    def pause(self, sid: str, pause: bool, d: Deadline) -> None:
        self._call(["pause" if pause else "unpause", sid], d)

    def reset(self, sid: str, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        h = self.holds.get(sid)
        if not isinstance(h, CLIHold):
            return _cli.parse_info(_cli.parse_json(self._call(_cli.reset_args(sid, keep_workspace), d), "reset"))
        try:
            info = h.reset(keep_workspace, d)
        except BaseException:
            if h.stopped:
                self.holds.pop(sid)
            raise
        self.holds.pop(sid)
        self.holds.add(info.id, h)
        return info

    def snapshot(self, provider: str, sid: str, name: str, d: Deadline) -> SnapshotInfo:
        out = self._call(_cli.snapshot_args(provider, sid, name), d)
        return _cli.parse_snapshot(_cli.parse_json(out, "snapshot create"))

    def snapshots(self, provider: str, d: Deadline) -> List[SnapshotInfo]:
        obj = _cli.parse_json(self._call(["snapshot", "list", "--json", "--provider", provider], d), "snapshot list")
        return [_cli.parse_snapshot(o) for o in obj or []]

    def delete_snapshot(self, provider: str, name: str, d: Deadline) -> None:
        self._call(["snapshot", "rm", "--provider", provider, name], d)

    def workspaces(self, provider: str, d: Deadline) -> List[WorkspaceInfo]:
        obj = _cli.parse_json(self._call(["workspace", "list", "--json", "--provider", provider], d), "workspace list")
        return [_cli.parse_workspace(o) for o in obj or []]

    def delete_workspace(self, provider: str, name: str, d: Deadline) -> None:
        self._call(["workspace", "rm", "--provider", provider, name], d)

    def write_file(self, sid: str, path: str, data: bytes, mode: int, d: Deadline) -> None:
        name = _tarutil.base_name(path, "path")
        with tempfile.TemporaryDirectory(prefix="roche-") as tmp:
            src = os.path.join(tmp, name)
            with open(src, "wb") as f:
                f.write(data)
            os.chmod(src, mode & 0o7777)
            self._call(["cp", "-T", src, f"{sid}:{path}"], d)

    def read_file(self, sid: str, path: str, d: Deadline, max_bytes: Optional[int] = None) -> bytes:
        _tarutil.base_name(path, "path")
        _tarutil.limit(max_bytes)
        with tempfile.TemporaryDirectory(prefix="roche-") as tmp:
            dst = os.path.join(tmp, "file")
            report = _cli.parse_copy_report(self._call(_cli.cp_args(f"{sid}:{path}", dst, max_bytes, False), d))
            if not os.path.lexists(dst) and report.skipped_links:
                raise PermissionDenied(f"permission denied: {path} is a symlink, which the files API does not follow")
            if os.path.isdir(dst):
                raise InvalidConfig(f"invalid config: {path} is a directory: read_file reads files; use copy_from for directories")
            with open(dst, "rb") as f:
                return f.read()

    def copy_to(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None) -> CopyReport:
        _tarutil.base_name(dst, "destination")
        _tarutil.limit(max_bytes)
        if not os.path.lexists(src):
            raise SandboxNotFound(f"not found: host path {src} does not exist")
        return _cli.parse_copy_report(self._call(_cli.cp_args(src, f"{sid}:{dst}", max_bytes, False), d))

    def copy_from(self, sid: str, src: str, dst: str, d: Deadline, max_bytes: Optional[int] = None,
                  preserve_links: bool = False) -> CopyReport:
        _tarutil.base_name(src, "source")
        _tarutil.limit(max_bytes)
        return _cli.parse_copy_report(self._call(_cli.cp_args(f"{sid}:{src}", dst, max_bytes, preserve_links), d))


def _provider_of(sid: str) -> str:
    """The provider an id belongs to: every provider but Docker prefixes its ids."""
    head, sep, _ = sid.partition("-")
    return head if sep and head.isalpha() and head != "docker" else "docker"


def _feed_stdin(p: subprocess.Popen[bytes], data: bytes) -> None:
    def write() -> None:
        try:
            assert p.stdin is not None
            p.stdin.write(data)
            p.stdin.close()
        except OSError:
            pass

    threading.Thread(target=write, daemon=True).start()


def stop(p: subprocess.Popen[bytes]) -> None:
    """Ends a CLI process: SIGTERM first, so that it cleans up (kills the command it
    runs, destroys a half-made sandbox), then SIGKILL."""
    try:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except OSError:
        pass
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()
