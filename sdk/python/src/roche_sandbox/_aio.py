"""What the asyncio half does its own way: waits within a deadline, work handed to
threads, a value made once for concurrent first callers, background tasks, and the roche
CLI as an asyncio subprocess. _syncio.py has the same names for the synchronous half, so
that the code written once in _async.py, _atransport.py and _apty.py reads the same in
both (unasync.py writes the synchronous files from those, _aio becoming _syncio)."""

from __future__ import annotations

import asyncio
import inspect
import signal
from typing import IO, Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Generic, Iterator, Optional, TypeVar, cast

from . import _cli, _tarutil
from ._deadline import Deadline
from ._lease import CLIHold
from .errors import RocheError

T = TypeVar("T")
M = TypeVar("M")

#: What a cancelled task raises at its await: the call it made is undone in Roche.
Cancelled = asyncio.CancelledError


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


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a worker thread: it blocks (a hold, a wait for a process), and the
    event loop must not."""
    return await asyncio.to_thread(fn, *args)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def uncancellable(fn: Callable[[], Awaitable[T]]) -> T:
    """fn(), run to its end even when the task awaiting it is cancelled (destroying a
    sandbox on the way out of a cancelled task's ``async with``)."""
    return await asyncio.shield(fn())


async def call(fn: Callable[[M], Any], arg: M) -> None:
    """A user's callback; one that returns an awaitable (an ``async def``) is awaited."""
    r = fn(arg)
    if inspect.isawaitable(r):
        await r


async def from_thread(gen: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The pieces of a generator that reads files, each made in a worker thread so the
    event loop never waits on the disk."""
    while True:
        piece = await asyncio.to_thread(next, gen, None)
        if piece is None:
            return
        yield piece


async def pieces(content: Any) -> AsyncIterator[bytes]:
    """The pieces of what files.write() sends (_filesutil.pieces_of): bytes whole, an
    async iterable as it yields, a generator that reads a file from a worker thread."""
    if isinstance(content, bytes):
        yield content
    elif hasattr(content, "__aiter__"):
        async for piece in content:
            if isinstance(piece, str):
                piece = piece.encode()
            yield bytes(piece)
    else:
        async for piece in from_thread(content):
            yield piece


async def read_pieces(messages: AsyncIterable[M], piece: Callable[[M], bytes],
                      consume: Callable[[IO[bytes]], T]) -> T:
    """consume's result, run on a file of the pieces of messages: consume runs in a worker
    thread (it writes files) and reads the pieces as they arrive, so nothing is held
    whole. When consume stops early (a cap, a refusal), the rest is not read."""
    reader = _tarutil.PipeReader()

    def run() -> T:
        try:
            return consume(cast(IO[bytes], reader))
        finally:
            reader.abandoned.set()

    work = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        async for m in messages:
            await asyncio.to_thread(reader.feed, piece(m))
        await asyncio.to_thread(reader.feed, None)
    except _tarutil.Abandoned:
        pass  # consume is done, early or refusing: its result says which
    except BaseException as e:
        reader.fail(e if isinstance(e, Exception) else RocheError("the copy was cancelled"))
        # The worker ends at its next read; its own error is this one's consequence.
        work.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise
    return await work


class Once(Generic[T]):
    """A value made on first use, once: concurrent first calls (asyncio.gather) share one
    making; one that failed is tried again by the next call."""

    def __init__(self) -> None:
        self._value: Optional[T] = None
        self._making: Optional[asyncio.Future[T]] = None

    async def get(self, make: Callable[[], Awaitable[T]]) -> T:
        if self._value is not None:
            return self._value
        if self._making is None or self._making.get_loop() is not asyncio.get_running_loop():
            self._making = asyncio.ensure_future(make())
        try:
            self._value = await asyncio.shield(self._making)
        except BaseException:
            if self._making.done():
                self._making = None
            raise
        return self._value

    def made(self) -> Optional[T]:
        """The value, if made."""
        return self._value


class Background(Generic[T]):
    """fn() running in a task of its own (name is for threads, the synchronous half's)."""

    def __init__(self, fn: Callable[[], Coroutine[Any, Any, T]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(fn())

    async def wait(self, timeout: Optional[float]) -> bool:
        """Whether fn has ended, within timeout seconds (None: as long as it takes)."""
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        return bool(done)

    def done(self) -> bool:
        """Whether fn has ended, without waiting."""
        return self._task.done()

    def result(self) -> T:
        """What fn returned, or raises what it raised; once it has ended."""
        return self._task.result()

    def cancel(self) -> None:
        self._task.cancel()


def let_go(held: list[CLIHold]) -> None:
    """Lets go of the sandboxes a transport holds, at close(). Not waited for (close()
    is not async): each holding roche destroys its sandbox and is reaped by a thread."""
    for h in held:
        h.reap_in_background()


async def spawn(cli: str, args: list[str], stdin: bool, direct: bool = True) -> Process:
    """`roche --direct ARGS` with its output piped, and its input when stdin; without
    --direct when not direct (a command only roched serves)."""
    try:
        p = await asyncio.create_subprocess_exec(
            cli, *(["--direct"] if direct else []), *args,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise _cli.cannot_run(cli, e) from None
    return Process(p)


class Process:
    """A roche CLI process: its input fed and its output read as the event loop allows."""

    def __init__(self, p: asyncio.subprocess.Process) -> None:
        self._p = p
        self._readers: dict[asyncio.Future[bytes], str] = {}
        self._feeder: Optional[asyncio.Future[None]] = None
        self._output: Optional[AsyncIterator[tuple[str, bytes]]] = None

    async def communicate(self, stdin: Optional[bytes], d: Deadline, what: str) -> tuple[bytes, bytes, int]:
        """Writes stdin, reads the output to its end and waits for the exit, within d:
        its output, its errors and its exit status. Stopped when that fails."""
        try:
            out, err = await within(d, self._p.communicate(stdin), what)
        except BaseException:
            await self.stop()
            raise
        return out, err, self._p.returncode if self._p.returncode is not None else -1

    def feed(self, data: bytes) -> None:
        """Writes data to its input and closes it, while the output is read."""
        assert self._p.stdin is not None
        self._feeder = asyncio.ensure_future(_feed(self._p.stdin, data))

    def feed_from(self, pieces: AsyncIterator[bytes]) -> None:
        """Writes the pieces to its input as they come, then closes it, while the output
        is read; fed() says how that went."""
        assert self._p.stdin is not None
        self._feeder = asyncio.ensure_future(_feed_from(self._p.stdin, pieces))

    async def fed(self) -> None:
        """Raises what reading the pieces raised (a file that could not be read), once
        they were fed; a process that stopped reading is not an error here (its exit
        status says why)."""
        if self._feeder is not None:
            await self._feeder

    def output(self, d: Deadline, what: str) -> AsyncIterator[tuple[str, bytes]]:
        """("stdout" or "stderr", data) as each arrives, until both end; d.expired(what)
        when d passes first."""
        self._output = self._read(d, what)
        return self._output

    async def _read(self, d: Deadline, what: str) -> AsyncIterator[tuple[str, bytes]]:
        assert self._p.stdout is not None and self._p.stderr is not None
        pipes = {"stdout": self._p.stdout, "stderr": self._p.stderr}
        for name, pipe in pipes.items():
            self._readers[asyncio.ensure_future(pipe.read(65536))] = name
        while self._readers:
            ready, _ = await within(d, asyncio.wait(self._readers, return_when=asyncio.FIRST_COMPLETED), what)
            for fut in ready:
                name = self._readers.pop(fut)
                data = fut.result()
                if data:
                    self._readers[asyncio.ensure_future(pipes[name].read(65536))] = name
                    yield name, data

    async def wait(self, d: Deadline, what: str) -> int:
        """Its exit status, within d."""
        return await within(d, self._p.wait(), what)

    async def close(self, stop: bool) -> None:
        """Stops reading and feeding it; with stop, ends it too."""
        if self._output is not None:
            await self._output.aclose()  # type: ignore[attr-defined]
        for fut in self._readers:
            fut.cancel()
        if self._feeder is not None:
            self._feeder.cancel()
        if stop:
            await self.stop()

    def terminate(self) -> None:
        """Sends it SIGTERM, without waiting (a watch's stop())."""
        try:
            self._p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    async def stop(self) -> None:
        """Ends it: SIGTERM first, so that it cleans up (kills the command it runs,
        destroys a half-made sandbox), then SIGKILL."""
        p = self._p
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


async def _feed(w: asyncio.StreamWriter, data: bytes) -> None:
    try:
        w.write(data)
        await w.drain()
        w.close()
    except (OSError, RuntimeError):
        pass


async def _feed_from(w: asyncio.StreamWriter, pieces: AsyncIterator[bytes]) -> None:
    try:
        async for piece in pieces:
            try:
                w.write(piece)
                await w.drain()
            except (OSError, RuntimeError):
                return  # it stopped reading: its exit status says why
    finally:
        try:
            w.close()
        except RuntimeError:
            pass
