"""The Connect protocol over HTTP/1.1 with http.client, on roched's unix socket or TCP.
Connections are kept and reused; one that fails or is left mid-response is closed."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional

from . import _tls, _wire
from .errors import ProviderUnavailable, RocheError, SandboxTimeout
from ._discovery import Endpoint


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
    return {"Authorization": f"Bearer {ep.token}"} if ep.token else {}


class Deadline:
    """An absolute time limit for one call; None is no limit."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> Optional[float]:
        if self.at is None:
            return None
        return self.at - time.monotonic()

    def expired(self, what: str) -> SandboxTimeout:
        return SandboxTimeout(
            f"timed out: {what} did not answer within {self.seconds:g} s; the call was abandoned "
            "(raise request_timeout= if the work is slow, or check that the sandbox is not paused)"
        )


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

    def unreachable(self, err: BaseException) -> ProviderUnavailable:
        failure = _tls.problem(self.ep.where, err)
        if failure is not None:
            return failure
        return ProviderUnavailable(
            f"roched is not answering on {self.ep.where}: start it (roche daemon start), "
            f"or let the SDK use the roche CLI (transport='cli'): {err}"
        )

    @contextmanager
    def _exchange(self, path: str, body: Any, headers: dict[str, str],
                  deadline: Deadline) -> Iterator[http.client.HTTPResponse]:
        """Sends one POST and yields its response; the connection goes back to the pool
        only when the response was read to its end."""
        hdrs = {**headers, **self._headers}
        retried = False
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
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
                yield _TimedResponse(resp, conn, deadline)  # type: ignore[misc]
                clean = resp.isclosed() and not resp.will_close
            except RocheError:
                raise
            except (socket.timeout, TimeoutError):
                raise deadline.expired(f"roched on {self.ep.where}") from None
            except (ConnectionRefusedError, FileNotFoundError) as e:
                raise self.unreachable(e) from None
            except (OSError, http.client.HTTPException) as e:
                failure = _tls.problem(self.ep.where, e)
                if failure is not None:
                    raise failure from None
                raise ProviderUnavailable(f"roched on {self.ep.where} broke off the call: {e} (is it still running?)") from None
            finally:
                if clean:
                    with self._lock:
                        self._idle.append(conn)
                else:
                    conn.close()
            return

    def health(self, timeout: float) -> dict[str, Any]:
        """GET /healthz; raises ProviderUnavailable when nothing answers."""
        conn = self._new(timeout)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise ProviderUnavailable(f"roched on {self.ep.where} answered /healthz with HTTP {resp.status}")
            health: dict[str, Any] = json.loads(body)
            return health
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise self.unreachable(e) from None
        finally:
            conn.close()

    def unary(self, method: str, msg: dict[str, Any], deadline: Deadline) -> dict[str, Any]:
        """One request, one response."""
        body = json.dumps(msg, separators=(",", ":")).encode()
        with self._exchange(_wire.SERVICE + method, body, _wire.UNARY_HEADERS, deadline) as resp:
            data = resp.read()
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

    def stream(self, method: str, body: Any, deadline: Deadline,
               trailers: Optional[dict[str, list[str]]] = None) -> Iterator[dict[str, Any]]:
        """The messages of a streaming response; body is one envelope or an iterable of them.
        Closing the iterator early closes the connection, which cancels the call. The
        response's trailers go into trailers, when given, once the stream has ended."""
        with self._exchange(_wire.SERVICE + method, body, _wire.STREAM_HEADERS, deadline) as resp:
            if resp.status != 200:
                data = resp.read()
                try:
                    obj = json.loads(data)
                except ValueError:
                    obj = None
                raise _wire.error_from_connect(obj, resp.status, self.ep.where)
            while True:
                head = resp.read(5)
                if len(head) < 5:
                    raise RocheError(f"roched on {self.ep.where} ended {method} without an end-of-stream message")
                flags, n = _wire.envelope_header(head)
                data = resp.read(n)
                if len(data) < n:
                    raise RocheError(f"roched on {self.ep.where} cut a {method} message short")
                if flags & _wire.END_STREAM:
                    resp.read()
                    if trailers is not None:
                        trailers.update(_wire.end_stream_metadata(data))
                    err = _wire.end_stream_error(data, self.ep.where)
                    if err is not None:
                        raise err
                    return
                yield json.loads(data)


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
        if self._conn.sock is not None:
            self._conn.sock.settimeout(_timeout(self._deadline))
        return self._resp.read(n)

    def isclosed(self) -> bool:
        return self._resp.isclosed()

    @property
    def will_close(self) -> bool:
        return bool(self._resp.will_close)


def envelopes(messages: Iterable[bytes]) -> Iterator[bytes]:
    """An iterator body, sent with chunked encoding."""
    yield from messages
