"""The Connect protocol over HTTP/1.1 with asyncio streams, for the async API: a small
HTTP/1.1 client (POST, Content-Length or chunked bodies), one connection per call. A
call that is cancelled or fails closes its connection, which cancels it on the daemon.

Connections are not kept between calls: an AsyncRoche often outlives its event loop
(one per asyncio.run), and a kept connection cannot outlive it cleanly. A local
connection costs about 0.1 ms."""

from __future__ import annotations

import asyncio
import json
import ssl
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Optional, TypeVar

from . import _tls, _wire
from ._discovery import Endpoint
from ._http import Deadline
from .errors import ProviderUnavailable, RocheError

T = TypeVar("T")


async def within(d: Deadline, aw: Awaitable[T], what: str) -> T:
    """Awaits aw within what is left of the deadline."""
    left = d.remaining()
    if left is None:
        return await aw
    if left <= 0:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise d.expired(what)
    try:
        return await asyncio.wait_for(aw, left)
    except asyncio.TimeoutError:
        raise d.expired(what) from None


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except RuntimeError:
            pass  # its event loop is gone


class Response:
    """A response whose body is read as it arrives."""

    def __init__(self, conn: _Conn, status: int, headers: dict[str, str], d: Deadline, where: str) -> None:
        self._conn, self.status, self.headers, self._d, self._where = conn, status, headers, d, where
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: Optional[int] = int(length) if length is not None and not self._chunked else None
        self._chunk_left = 0
        self.done = self._left == 0

    async def _read(self, n: int) -> bytes:
        return await within(self._d, self._conn.reader.readexactly(n), f"roched on {self._where}")

    async def _line(self) -> bytes:
        return await within(self._d, self._conn.reader.readline(), f"roched on {self._where}")

    async def read(self, n: int) -> bytes:
        """Up to n bytes of body, fewer only at its end."""
        out = bytearray()
        while len(out) < n and not self.done:
            if self._chunked:
                if self._chunk_left == 0:
                    size = int((await self._line()).split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while (await self._line()).strip():
                            pass  # trailers
                        self.done = True
                        break
                    self._chunk_left = size
                take = min(n - len(out), self._chunk_left)
                out += await self._read(take)
                self._chunk_left -= take
                if self._chunk_left == 0:
                    await self._read(2)  # the chunk's CRLF
            elif self._left is not None:
                take = min(n - len(out), self._left)
                out += await self._read(take)
                self._left -= take
                self.done = self._left == 0
            else:
                b = await within(self._d, self._conn.reader.read(n - len(out)), f"roched on {self._where}")
                if not b:
                    self.done = True
                out += b
        return bytes(out)

    async def read_all(self) -> bytes:
        out = bytearray()
        while not self.done:
            out += await self.read(1 << 16)
        return bytes(out)


class AsyncHTTPClient:
    """HTTP/1.1 calls to one roched."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self._auth = f"Authorization: Bearer {ep.token}\r\n" if ep.token else ""
        host = "roched" if ep.socket else f"{ep.host}:{ep.port}"
        self._host = host

    def unreachable(self, err: BaseException) -> ProviderUnavailable:
        failure = _tls.problem(self.ep.where, err)
        if failure is not None:
            return failure
        return ProviderUnavailable(
            f"roched is not answering on {self.ep.where}: start it (roche daemon start), "
            f"or let the SDK use the roche CLI (transport='cli'): {err}"
        )

    async def _open(self, d: Deadline) -> _Conn:
        try:
            if self.ep.socket:
                r, w = await within(d, asyncio.open_unix_connection(self.ep.socket, limit=1 << 20),
                                    f"roched on {self.ep.where}")
            else:
                ctx = (self.ep.ssl_context or ssl.create_default_context()) if self.ep.tls else None
                r, w = await within(d, asyncio.open_connection(self.ep.host, self.ep.port, ssl=ctx, limit=1 << 20),
                                    f"roched on {self.ep.where}")
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise self.unreachable(e) from None
        except OSError as e:
            if isinstance(e, RocheError):
                raise
            raise self.unreachable(e) from None
        return _Conn(r, w)

    def close(self) -> None:
        """Nothing to release: connections last one call."""

    async def _send(self, conn: _Conn, path: str, ctype: str, body: Any, d: Deadline) -> None:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: {ctype}\r\n"
                f"Connect-Protocol-Version: 1\r\n{self._auth}")
        w = conn.writer
        if isinstance(body, (bytes, bytearray)):
            w.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + bytes(body))
        else:
            w.write(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
            pieces = body if hasattr(body, "__aiter__") else _aiter(body)
            async for piece in pieces:
                if piece:
                    w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await within(d, w.drain(), f"roched on {self.ep.where}")
            w.write(b"0\r\n\r\n")
        await within(d, w.drain(), f"roched on {self.ep.where}")

    async def _head(self, conn: _Conn, d: Deadline) -> tuple[int, dict[str, str]]:
        line = await within(d, conn.reader.readline(), f"roched on {self.ep.where}")
        if not line:
            raise ConnectionResetError("connection closed before a response")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise RocheError(f"roched on {self.ep.where} sent a malformed response: {line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            h = await within(d, conn.reader.readline(), f"roched on {self.ep.where}")
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    @asynccontextmanager
    async def exchange(self, path: str, ctype: str, body: Any, d: Deadline) -> AsyncIterator[Response]:
        """Sends one POST on a connection of its own and yields its response."""
        conn = await self._open(d)
        try:
            await self._send(conn, path, ctype, body, d)
            status, headers = await self._head(conn, d)
            yield Response(conn, status, headers, d, self.ep.where)
        except RocheError:
            raise
        except (OSError, asyncio.IncompleteReadError) as e:
            failure = _tls.problem(self.ep.where, e)
            if failure is not None:
                raise failure from None
            raise ProviderUnavailable(
                f"roched on {self.ep.where} broke off the call: {e} (is it still running?)") from None
        finally:
            conn.close()

    async def health(self, timeout: float) -> dict[str, Any]:
        """GET /healthz; raises ProviderUnavailable when nothing answers."""
        d = Deadline(timeout)
        conn = await self._open(d)
        try:
            conn.writer.write(f"GET /healthz HTTP/1.1\r\nHost: {self._host}\r\nConnection: close\r\n\r\n".encode())
            await within(d, conn.writer.drain(), "roched")
            status, headers = await self._head(conn, d)
            body = await Response(conn, status, headers, d, self.ep.where).read_all()
            if status != 200:
                raise ProviderUnavailable(f"roched on {self.ep.where} answered /healthz with HTTP {status}")
            health: dict[str, Any] = json.loads(body)
            return health
        except RocheError as e:
            if isinstance(e, ProviderUnavailable):
                raise
            raise self.unreachable(e) from None
        except (OSError, ValueError, asyncio.IncompleteReadError) as e:
            raise self.unreachable(e) from None
        finally:
            conn.close()

    async def unary(self, method: str, msg: dict[str, Any], d: Deadline) -> dict[str, Any]:
        body = json.dumps(msg, separators=(",", ":")).encode()
        async with self.exchange(_wire.SERVICE + method, "application/json", body, d) as resp:
            data = await resp.read_all()
            status = resp.status
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
        """The messages of a streaming response; body is one envelope or an iterable of them.
        The response's trailers go into trailers, when given, once the stream has ended."""
        async with self.exchange(_wire.SERVICE + method, "application/connect+json", body, d) as resp:
            if resp.status != 200:
                data = await resp.read_all()
                try:
                    obj = json.loads(data)
                except ValueError:
                    obj = None
                raise _wire.error_from_connect(obj, resp.status, self.ep.where)
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
                yield json.loads(data)


async def _aiter(pieces: Any) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
