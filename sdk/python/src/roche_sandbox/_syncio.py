"""What the synchronous half does its own way, under the names _aio.py gives the asyncio
half's: the code unasync.py writes from _async.py, _atransport.py and _apty.py calls
these where the asyncio half awaits those. Here a call blocks the calling thread: work
"in a thread" runs in it, a value made once is made under a lock, and the roche CLI is a
plain subprocess whose pipes a selector reads."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from typing import IO, Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar, cast

from . import _cli, _tarutil
from ._deadline import Deadline
from ._lease import UNDO_TIMEOUT, CLIHold

T = TypeVar("T")
M = TypeVar("M")


class Cancelled(BaseException):
    """Never raised: nothing cancels a blocking call from outside (Ctrl-C is
    KeyboardInterrupt, which the code handles as any other error). The asyncio half's
    CancelledError stands here, so that the code shared with it reads the same."""


def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), in this thread: blocking is what a synchronous call does."""
    return fn(*args)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def uncancellable(fn: Callable[[], T]) -> T:
    """fn(), which nothing here cancels."""
    return fn()


def call(fn: Callable[[M], Any], arg: M) -> None:
    """A user's callback."""
    fn(arg)


def from_thread(gen: Iterator[bytes]) -> Iterator[bytes]:
    """The pieces of a generator that reads files, read in this thread as they are sent."""
    return gen


def pieces(content: Any) -> Iterator[bytes]:
    """The pieces of what files.write() sends (_filesutil.pieces_of): bytes whole, an
    iterable as it yields; an async iterable needs the async API."""
    if isinstance(content, bytes):
        return iter([content])
    if hasattr(content, "__aiter__"):
        from .errors import InvalidConfig
        raise InvalidConfig("invalid config: write() got an async iterable: use AsyncRoche, or give bytes, a file or an iterable of bytes")
    return iter(content)


def read_pieces(messages: Iterable[M], piece: Callable[[M], bytes], consume: Callable[[IO[bytes]], T]) -> T:
    """consume's result, run on a file of the pieces of messages as they arrive, so that
    nothing is held whole. When consume stops early (a cap, a refusal), the rest is not read."""
    return consume(cast(IO[bytes], _tarutil.ChunkReader(piece(m) for m in messages)))


class Once(Generic[T]):
    """A value made on first use, once, however many threads ask at the same time; one
    that failed is tried again by the next call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Optional[T] = None

    def get(self, make: Callable[[], T]) -> T:
        with self._lock:
            if self._value is None:
                self._value = make()
            return self._value

    def made(self) -> Optional[T]:
        """The value, if made (waiting for a making under way)."""
        with self._lock:
            return self._value


class Background(Generic[T]):
    """fn() running in a daemon thread of its own, named name."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._result: Optional[T] = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self._done.set()

    def wait(self, timeout: Optional[float]) -> bool:
        """Whether fn has ended, within timeout seconds (None: as long as it takes)."""
        return self._done.wait(timeout)

    def done(self) -> bool:
        """Whether fn has ended, without waiting."""
        return self._done.is_set()

    def result(self) -> T:
        """What fn returned, or raises what it raised; once it has ended."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def let_go(held: list[CLIHold]) -> None:
    """Lets go of the sandboxes a transport holds, at close(): each holding roche destroys
    its sandbox; those not done within UNDO_TIMEOUT are reaped by a thread."""
    for h in held:
        h.release()
    d = Deadline(UNDO_TIMEOUT)
    for h in held:
        if h.finish(d) is None:
            h.reap_in_background()


def spawn(cli: str, args: list[str], stdin: bool, direct: bool = True) -> Process:
    """`roche --direct ARGS` with its output piped, and its input when stdin; without
    --direct when not direct (a command only roched serves)."""
    try:
        p = subprocess.Popen([cli, *(["--direct"] if direct else []), *args],
                             stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise _cli.cannot_run(cli, e) from None
    return Process(p)


class Process:
    """A roche CLI process: its input fed from a thread, its output read with a selector."""

    def __init__(self, p: subprocess.Popen[bytes]) -> None:
        self._p = p
        self._sel: Optional[selectors.BaseSelector] = None

    def communicate(self, stdin: Optional[bytes], d: Deadline, what: str) -> tuple[bytes, bytes, int]:
        """Writes stdin, reads the output to its end and waits for the exit, within d:
        its output, its errors and its exit status. Stopped when that fails."""
        try:
            out, err = self._p.communicate(stdin, timeout=d.remaining())
        except subprocess.TimeoutExpired:
            self.stop()
            raise d.expired(what) from None
        except BaseException:
            self.stop()
            raise
        return out, err, self._p.returncode

    def feed(self, data: bytes) -> None:
        """Writes data to its input and closes it, from a thread: a pipe holds 64 KiB, and
        the output must be read meanwhile."""
        p = self._p

        def write() -> None:
            try:
                assert p.stdin is not None
                p.stdin.write(data)
                p.stdin.close()
            except OSError:
                pass

        threading.Thread(target=write, daemon=True).start()

    def feed_from(self, pieces: Iterator[bytes]) -> None:
        """Writes the pieces to its input as they come, from a thread, then closes it;
        fed() says how that went."""
        p = self._p
        self._fed = threading.Event()
        self._feed_error: Optional[BaseException] = None

        def write() -> None:
            assert p.stdin is not None
            try:
                for piece in pieces:
                    try:
                        p.stdin.write(piece)
                    except OSError:
                        return  # it stopped reading: its exit status says why
            except BaseException as e:  # handed to fed()
                self._feed_error = e
            finally:
                try:
                    p.stdin.close()
                except OSError:
                    pass
                self._fed.set()

        threading.Thread(target=write, daemon=True).start()

    def fed(self) -> None:
        """Raises what reading the pieces raised, once they were fed."""
        fed = getattr(self, "_fed", None)
        if fed is not None:
            fed.wait()
            if self._feed_error is not None:
                raise self._feed_error

    def output(self, d: Deadline, what: str) -> Iterator[tuple[str, bytes]]:
        """("stdout" or "stderr", data) as each arrives, until both end; d.expired(what)
        when d passes first."""
        assert self._p.stdout is not None and self._p.stderr is not None
        sel = self._sel = selectors.DefaultSelector()
        sel.register(self._p.stdout, selectors.EVENT_READ, "stdout")
        sel.register(self._p.stderr, selectors.EVENT_READ, "stderr")
        open_streams = 2
        while open_streams:
            left = d.remaining()
            if left is not None and left <= 0:
                raise d.expired(what)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                yield key.data, data

    def wait(self, d: Deadline, what: str) -> int:
        """Its exit status, within d."""
        try:
            return self._p.wait(timeout=d.remaining())
        except subprocess.TimeoutExpired:
            raise d.expired(what) from None

    def close(self, stop: bool) -> None:
        """Stops reading it; with stop, ends it too."""
        if self._sel is not None:
            self._sel.close()
        if stop:
            self.stop()
        for f in (self._p.stdout, self._p.stderr):
            if f is not None:
                f.close()

    def terminate(self) -> None:
        """Sends it SIGTERM, without waiting (a watch's stop(), from another thread)."""
        try:
            if self._p.poll() is None:
                self._p.send_signal(signal.SIGTERM)
        except OSError:
            pass

    def stop(self) -> None:
        """Ends it: SIGTERM first, so that it cleans up (kills the command it runs,
        destroys a half-made sandbox), then SIGKILL."""
        p = self._p
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
