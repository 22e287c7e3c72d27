"""HTTP/1.1 to roched for the asyncio half, on asyncio streams: a small client (POST
with a Content-Length or chunked body, a response read as it arrives), one connection
per call. A call that is cancelled or fails closes its connection, which cancels it on
the daemon. _http.py is the synchronous counterpart; the Connect protocol on top of both
is in _atransport.py.

Connections are not kept between calls: an AsyncRoche often outlives its event loop
(one per asyncio.run), and a kept connection cannot outlive it cleanly. A local
connection costs about 0.1 ms."""

from __future__ import annotations

import asyncio
import ssl
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from ._aio import within
from ._deadline import Deadline
from ._discovery import Endpoint
from .errors import ProviderUnavailable, RocheError


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

    def abort(self) -> None:
        """Breaks off the call: a read waiting in it ends."""
        self._conn.close()

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
        if ep.traceparent:
            self._auth += f"traceparent: {ep.traceparent}\r\n"
        self._host = "roched" if ep.socket else f"{ep.host}:{ep.port}"

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
            raise self.ep.unreachable(e) from None
        except OSError as e:
            if isinstance(e, RocheError):
                raise
            raise self.ep.unreachable(e) from None
        return _Conn(r, w)

    def close(self) -> None:
        """Nothing to release: connections last one call."""

    async def _send(self, conn: _Conn, path: str, headers: dict[str, str], body: Any, d: Deadline) -> None:
        head = f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + self._auth
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
    async def exchange(self, path: str, headers: dict[str, str], body: Any, d: Deadline) -> AsyncIterator[Response]:
        """Sends one POST (body: bytes, or an iterable or async iterable of pieces sent
        chunked) on a connection of its own and yields its response."""
        conn = await self._open(d)
        try:
            await self._send(conn, path, headers, body, d)
            status, hdrs = await self._head(conn, d)
            yield Response(conn, status, hdrs, d, self.ep.where)
        except RocheError:
            raise
        except (OSError, asyncio.IncompleteReadError) as e:
            raise self.ep.broke_off(e) from None
        finally:
            conn.close()

    async def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        """A GET: the status and the body; ProviderUnavailable when nothing answers."""
        d = Deadline(timeout)
        conn = await self._open(d)
        try:
            conn.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self._host}\r\nConnection: close\r\n\r\n".encode())
            await within(d, conn.writer.drain(), "roched")
            status, headers = await self._head(conn, d)
            return status, await Response(conn, status, headers, d, self.ep.where).read_all()
        except RocheError as e:
            if isinstance(e, ProviderUnavailable):
                raise
            raise self.ep.unreachable(e) from None
        except (OSError, ValueError, asyncio.IncompleteReadError) as e:
            raise self.ep.unreachable(e) from None
        finally:
            conn.close()


async def _aiter(pieces: Any) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
