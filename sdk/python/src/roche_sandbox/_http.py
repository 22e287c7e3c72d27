"""HTTP/1.1 to roched for the synchronous half, with http.client, on its unix socket or
TCP: one POST at a time per connection, its response read as it arrives. Connections
are kept and reused; one that fails or is left mid-response is closed. _ahttp.py is the
asyncio counterpart; the Connect protocol on top of both is in _atransport.py."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ._deadline import Deadline
from ._discovery import Endpoint
from .errors import RocheError

__all__ = ["Deadline", "HTTPClient", "auth_headers", "connection"]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("roched", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def connection(ep: Endpoint, timeout: Optional[float]) -> http.client.HTTPConnection:
    """A new (not yet connected) HTTP/1.1 connection to roched."""
    if ep.socket:
        return _UnixConnection(ep.socket, timeout)
    if ep.tls:
        return http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout,
                                           context=ep.ssl_context or ssl.create_default_context())
    return http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)


def auth_headers(ep: Endpoint) -> dict[str, str]:
    """The headers that authenticate a call to roched on TCP."""
    h = {"Authorization": f"Bearer {ep.token}"} if ep.token else {}
    if ep.traceparent:
        h["traceparent"] = ep.traceparent
    return h


# Errors meaning the server closed a kept connection before our request reached it.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class HTTPClient:
    """A small pool of HTTP/1.1 connections to one roched. Safe for use from threads."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._headers = auth_headers(ep)

    def _new(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        return connection(self.ep, timeout)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def __del__(self) -> None:
        # A Roche used without close() (as in most scripts) leaves no socket open.
        for c in getattr(self, "_idle", []):
            c.close()

    @contextmanager
    def exchange(self, path: str, headers: dict[str, str], body: Any,
                 deadline: Deadline) -> Iterator["_TimedResponse"]:
        """Sends one POST (body: bytes, or an iterator of pieces sent chunked) and yields
        its response; the connection goes back to the pool only when the response was
        read to its end."""
        hdrs = {**headers, **self._headers}
        retried = False
        while True:
            with self._lock:
                # A body read as it is sent cannot be sent twice: it gets a fresh connection,
                # never a kept one the server may have closed meanwhile.
                conn = self._idle.pop() if self._idle and not isinstance(body, Iterator) else None
            reused = conn is not None
            if conn is None:
                conn = self._new(None)
            clean = False
            try:
                try:
                    if conn.sock is None:
                        conn.timeout = _timeout(deadline)
                        conn.connect()
                    if conn.sock is not None:
                        conn.sock.settimeout(_timeout(deadline))
                    conn.request("POST", path, body=body, headers=hdrs)
                    resp = conn.getresponse()
                except _STALE:
                    if reused and not retried and not isinstance(body, Iterator):
                        retried = True
                        continue
                    raise
                yield _TimedResponse(resp, conn, deadline)
                clean = resp.isclosed() and not resp.will_close
            except RocheError:
                raise
            except (socket.timeout, TimeoutError):
                raise deadline.expired(f"roched on {self.ep.where}") from None
            except (ConnectionRefusedError, FileNotFoundError) as e:
                raise self.ep.unreachable(e) from None
            except (OSError, http.client.HTTPException) as e:
                raise self.ep.broke_off(e) from None
            finally:
                if clean:
                    with self._lock:
                        self._idle.append(conn)
                else:
                    conn.close()
            return

    def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        """A GET on a connection of its own: the status and the body; ProviderUnavailable
        when nothing answers."""
        conn = self._new(timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise self.ep.unreachable(e) from None
        finally:
            conn.close()


def _timeout(deadline: Deadline) -> Optional[float]:
    r = deadline.remaining()
    if r is None:
        return None
    if r <= 0:
        raise socket.timeout("deadline passed")
    return r


class _TimedResponse:
    """An HTTPResponse whose reads each get what is left of the call's deadline."""

    def __init__(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: Deadline) -> None:
        self._resp, self._conn, self._deadline = resp, conn, deadline
        self.status = resp.status

    def read(self, n: Optional[int] = None) -> bytes:
        """Up to n bytes of the body (fewer only at its end); all of it without n."""
        if self._conn.sock is not None:
            self._conn.sock.settimeout(_timeout(self._deadline))
        return self._resp.read(n)

    def read_all(self) -> bytes:
        return self.read()

    def abort(self) -> None:
        """Breaks off the call from another thread: a read waiting in it fails at once."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
