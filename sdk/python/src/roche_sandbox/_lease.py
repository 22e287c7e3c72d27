"""Leases: the sandboxes the SDK creates are tied to this process, so that one it was
using goes within seconds when the process dies, however it dies (kill -9 included),
instead of living out its lifetime.

Through roched, a leased sandbox is held by a Hold stream: roched destroys it a few
seconds after the stream ends. Through the CLI, `roche create --hold` made it and holds
it (and its lease) until its standard input closes, then destroys it. Either way what
holds the sandbox is an open file descriptor of this process, a connection or a pipe,
which the kernel closes when the process ends: no Python code has to run to keep it, so
a busy or stuck interpreter keeps its sandboxes for as long as the process lives.

Both the sync and the async API use these (the async one from worker threads): a hold
must not end with an event loop, since an AsyncRoche often outlives its loop."""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from typing import IO, Iterator, Optional, Protocol

from . import _cli, _wire
from ._discovery import Endpoint
from ._deadline import Deadline
from ._http import auth_headers, connection
from .errors import InvalidConfig, ProviderUnavailable, RocheError, SandboxNotFound
from .types import SandboxInfo

#: A Hold cut (roched restarting) is taken again for this long after it last answered,
#: every HOLD_RETRY_DELAY, as the Go client does.
HOLD_RETRY_FOR = 30.0
HOLD_RETRY_DELAY = 0.5
#: roched sends a message on a Hold every 15 s: silence this long means a dead connection.
HOLD_SILENCE = 45.0
#: How long one attempt to reach roched for a Hold may take.
HOLD_CONNECT_TIMEOUT = 10.0
#: How long undoing a half-done call, or letting go at close(), may take.
UNDO_TIMEOUT = 20.0


class Hold(Protocol):
    """What holds one sandbox."""

    def release(self) -> None:
        """Lets go: the sandbox is destroyed shortly. Never blocks."""

    def ended(self) -> bool:
        """Whether the hold is over by itself (the sandbox is gone): it can be forgotten."""

    def forget_in_child(self) -> None:
        """After fork(), in the child: closes the child's copy of what holds it."""


class Holds:
    """The sandboxes one transport holds, by id. Safe for use from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Hold] = {}
        _every_holds.add(self)

    def _forget_in_child(self) -> None:
        """After fork(), in the child: the holds are the parent's (see _after_fork)."""
        held, self._by_id, self._lock = list(self._by_id.values()), {}, threading.Lock()
        for h in held:
            h.forget_in_child()

    def add(self, sid: str, h: Hold) -> None:
        with self._lock:
            # Sandboxes never destroyed by the program end at their lifetime, and their
            # holds with them: forget those, so that a long-lived program keeps no
            # record (or exited roche process) per sandbox it ever made.
            ended = [k for k, v in self._by_id.items() if v.ended()]
            for k in ended:
                del self._by_id[k]
            old = self._by_id.get(sid)
            self._by_id[sid] = h
        if old is not None and old is not h:
            old.release()

    def get(self, sid: str) -> Optional[Hold]:
        with self._lock:
            return self._by_id.get(sid)

    def pop(self, sid: str) -> Optional[Hold]:
        with self._lock:
            return self._by_id.pop(sid, None)

    def pop_all(self) -> list[Hold]:
        with self._lock:
            held, self._by_id = list(self._by_id.values()), {}
        return held


class DaemonHold:
    """Holds one leased sandbox with roched's Hold stream, from a daemon thread of its own,
    on a connection of its own, until release() or the end of the process. A stream cut
    or refused (roched restarting), the first one included, is taken again for
    HOLD_RETRY_FOR; the hold ends for good when roched says the sandbox is gone."""

    def __init__(self, ep: Endpoint, sid: str) -> None:
        self.sid = sid
        self._ep = ep
        self._stop = threading.Event()
        self._settled = threading.Event()  # held once, or given up
        self._held = False
        self.error: Optional[RocheError] = None
        self._lock = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None
        self._thread = threading.Thread(target=self._run, name=f"roche-hold-{sid[:12]}", daemon=True)

    def start(self, d: Deadline) -> None:
        """Starts holding, and returns once roched has the hold: raises, having let go,
        when it cannot be taken within d."""
        self._thread.start()
        if not self._settled.wait(d.remaining()):
            self.release()
            raise d.expired(f"roched's Hold of sandbox {self.sid}")
        if not self._held:
            self.release()
            raise self.error or RocheError(f"roched on {self._ep.where} did not hold sandbox {self.sid}")

    def release(self) -> None:
        self._stop.set()
        with self._lock:
            conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                # Wakes the hold thread out of its read; it closes the connection.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def ended(self) -> bool:
        return self._settled.is_set() and not self._thread.is_alive()

    def forget_in_child(self) -> None:
        # Closes the child's descriptor only, never shutdown(), which would end the
        # parent's connection too; detached first, as the response's reader still
        # refers to the socket, which would keep it open through a close().
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                os.close(sock.detach())
            except OSError:
                pass

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            err: Optional[RocheError] = None
            try:
                for _ in self._stream():
                    last = time.monotonic()
                    if not self._held:
                        self._held = True
                        self._settled.set()
            except RocheError as e:
                err = e
            except (OSError, http.client.HTTPException, ValueError) as e:
                err = ProviderUnavailable(f"roched on {self._ep.where} broke off the Hold of sandbox {self.sid}: {e}")
            if self._stop.is_set():
                break
            # A connection lost before the first message is taken again too, as the Go
            # client does: the create just reached roched, so it is restarting, or a
            # replica died behind a Service that sends the next connection to another.
            # An answer before the first message (not a lost connection) fails at once.
            if (isinstance(err, (SandboxNotFound, InvalidConfig))
                    or (not self._held and not isinstance(err, ProviderUnavailable))
                    or time.monotonic() - last > HOLD_RETRY_FOR):
                self.error = err
                break
            self._stop.wait(HOLD_RETRY_DELAY)
        self._settled.set()

    def _stream(self) -> Iterator[None]:
        """One Hold call: yields at each message roched sends, until the stream ends."""
        conn = connection(self._ep, HOLD_CONNECT_TIMEOUT)
        with self._lock:
            if self._stop.is_set():
                return
            self._conn = conn
        try:
            body = _wire.envelope({"sandboxId": self.sid})
            conn.request("POST", _wire.SERVICE + "Hold", body=body,
                         headers={**_wire.STREAM_HEADERS, **auth_headers(self._ep)})
            resp = conn.getresponse()
            if self._stop.is_set():
                return  # let go while connecting: release() found no socket to shut
            if resp.status != 200:
                raise _wire.error_response(resp.read(), resp.status, self._ep.where)
            if conn.sock is not None:
                conn.sock.settimeout(HOLD_SILENCE)
            while True:
                head = resp.read(5)
                if len(head) < 5:
                    raise ProviderUnavailable(f"roched on {self._ep.where} ended the Hold of sandbox {self.sid}")
                flags, n = _wire.envelope_header(head)
                data = resp.read(n)
                if flags & _wire.END_STREAM:
                    err = _wire.end_stream_error(data, self._ep.where)
                    if err is not None:
                        raise err
                    return
                yield
        finally:
            with self._lock:
                self._conn = None
            conn.close()


class CLIHold:
    """`roche --direct create --hold --json ...`: the roche process that made the sandbox
    keeps it, and its lease, until its standard input closes, and destroys it then. The
    pipe closes when this process ends, however it ends; killed too, roche leaves a
    sandbox whose lease lapses within seconds. Reset is asked of it ("reset" lines), so
    that the new sandbox is held by it too."""

    def __init__(self, cli: str, args: list[str]) -> None:
        # Its errors go to a file: nothing reads stderr while it holds, and a pipe could fill.
        self._stderr: IO[bytes] = tempfile.TemporaryFile(prefix="roche-hold-")
        try:
            # A session of its own: Ctrl-C at a terminal interrupts this program (which
            # then destroys what it wants gone), not the process holding its sandboxes.
            self._p = subprocess.Popen([cli, "--direct", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=self._stderr, start_new_session=True)
        except OSError as e:
            self._stderr.close()
            raise _cli.cannot_run(cli, e) from None
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.sid = ""

    @property
    def pid(self) -> int:
        return self._p.pid

    @property
    def stopped(self) -> bool:
        """Whether roche has exited: it holds nothing any more."""
        return self._p.poll() is not None

    def ended(self) -> bool:
        # poll() reaps it; its pipes close with this object.
        return self.stopped

    def forget_in_child(self) -> None:
        # The child's copy of the pipe only: the parent's stays open.
        try:
            if self._p.stdin is not None:
                self._p.stdin.close()
        except OSError:
            pass

    def first(self, d: Deadline) -> SandboxInfo:
        """The sandbox, once roche has made it (and holds it); its error otherwise."""
        try:
            line = self._line(d, "roche create")
            if line is None:
                raise self._failed("create", d)
            info = _cli.parse_info(_cli.parse_json(line, "create --hold"))
        except BaseException:
            self.stop()  # SIGTERM: roche undoes a create in progress, destroys a sandbox made
            raise
        self.sid = info.id
        return info

    def reset(self, keep_workspace: bool, d: Deadline) -> SandboxInfo:
        """Resets the sandbox in the holding roche; the new one is held as the old was."""
        with self._lock:
            try:
                assert self._p.stdin is not None
                self._p.stdin.write(b"reset\n" if keep_workspace else b"reset --wipe-workspace\n")
                self._p.stdin.flush()
            except OSError:
                raise self._failed("reset", d) from None
            try:
                line = self._line(d, "roche reset")
            except BaseException:
                # Its answer may still come, and would be taken for the next one's: this
                # hold is over (SIGTERM: roche destroys the sandbox).
                self.stop()
                raise
            if line is None:
                raise self._failed("reset", d)
            if line.startswith(b"roche: "):
                raise _cli.error_from_stderr(line, 1, "reset")
            info = _cli.parse_info(_cli.parse_json(line, "reset"))
            self.sid = info.id
            return info

    def release(self) -> None:
        """Closes roche's standard input: it destroys the sandbox and exits."""
        try:
            if self._p.stdin is not None:
                self._p.stdin.close()
        except OSError:
            pass  # it has exited already

    def finish(self, d: Deadline) -> Optional[int]:
        """Lets go, and waits within d for roche to have destroyed the sandbox: its exit
        status, or None when it has not exited in time."""
        self.release()
        try:
            rc = self._p.wait(timeout=_positive(d.remaining()))
        except subprocess.TimeoutExpired:
            return None
        self._close_files()
        return rc

    def reap_in_background(self, limit: float = 60.0) -> None:
        """Lets go, and waits for roche's exit from a daemon thread (no zombie is left)."""
        threading.Thread(target=self.finish, args=(Deadline(limit),), daemon=True).start()

    def stop(self) -> None:
        """Ends roche: SIGTERM first, so that it cleans up (destroys the sandbox), then SIGKILL."""
        try:
            if self._p.poll() is None:
                self._p.send_signal(signal.SIGTERM)
                self._p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._p.kill()
            self._p.wait()
        except OSError:
            pass
        self.release()
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._p.stdout, self._stderr):
            try:
                f.close()  # type: ignore[union-attr]
            except (OSError, AttributeError):
                pass

    def _line(self, d: Deadline, what: str) -> Optional[bytes]:
        """The next line roche prints, within d; None when it has closed its output."""
        assert self._p.stdout is not None
        fd = self._p.stdout.fileno()
        while b"\n" not in self._buf:
            left = d.remaining()
            if left is not None and left <= 0:
                raise d.expired(what)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise d.expired(what)
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line

    def _failed(self, verb: str, d: Deadline) -> RocheError:
        """roche's error, once it has closed its output (it is exiting)."""
        try:
            rc = self._p.wait(timeout=max(_positive(d.remaining()) or 0.0, 5.0))
        except subprocess.TimeoutExpired:
            self.stop()
            rc = self._p.returncode if self._p.returncode is not None else -1
        try:
            self._stderr.seek(0)
            err = self._stderr.read()
        except (OSError, ValueError):
            err = b""
        self._close_files()
        return _cli.error_from_stderr(err, rc, verb)


_every_holds: "weakref.WeakSet[Holds]" = weakref.WeakSet()


def _after_fork() -> None:
    """In a child made by fork() (multiprocessing's default on Linux), the parent's
    sandboxes must go with the parent, not live on in the child's copies of the
    connections and pipes that hold them, and the child's Roche objects must not let go
    of them (a shutdown() of a shared connection ends it for the parent too)."""
    for holds in list(_every_holds):
        holds._forget_in_child()


os.register_at_fork(after_in_child=_after_fork)


def _positive(left: Optional[float]) -> Optional[float]:
    return None if left is None else max(left, 0.0)
