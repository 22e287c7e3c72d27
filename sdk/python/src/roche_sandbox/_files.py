# Generated from _afiles.py by sdk/python/unasync.py: do not edit. Edit _afiles.py, then
# run `python3 sdk/python/unasync.py` (a test fails while this file is stale).
"""``sandbox.files`` for the synchronous API: the files API, named as E2B's SDKs name it, its
content streamed both ways; a watch is read by a thread of its own."""

from __future__ import annotations

import collections
import threading
from typing import Any, Iterator, Callable, List, Literal, Optional, Union, overload

from . import _syncio
from ._deadline import Deadline, IdleDeadline
from ._filesutil import (WATCH_QUEUE, Abort, EntryInfo, FilesystemEvent, FilesystemEventType, FileType, WriteInfo, check_depth,
                         check_mode, check_path, pieces_of)
from .errors import RocheError

#: What on_event is: a function of each event, in the async API one that may be a
#: coroutine function (it is awaited).
OnEvent = Callable[[FilesystemEvent], Any]
#: What on_exit is: called once the watch ends, with the error that ended it (None when
#: stopped, or when the watched directory itself went).
OnExit = Callable[[Optional[Exception]], Any]


class WatchHandle:
    """A watch of a directory (``files.watch_dir``). Its events go to ``on_event`` when
    one was given, from a thread of its own (in the async API, a task); otherwise they
    are kept, at most 10,000 (an overflow event counts what did not fit), for
    ``get_new_events()`` or for iterating the handle (``for event in handle``),
    which waits for each. ``stop()`` ends it; so does the removal of the directory, whose
    own event (name "") is then the last."""

    def __init__(self, events: Iterator[Optional[FilesystemEvent]], abort: Abort, on_event: Optional[OnEvent],
                 on_exit: Optional[OnExit]) -> None:
        self._events, self._abort = events, abort
        self._on_event, self._on_exit = on_event, on_exit
        self._lock = threading.Lock()
        self._kept: collections.deque[FilesystemEvent] = collections.deque()
        self._lost = 0
        self._arrived = threading.Event()
        self._stopped = False
        #: The error that ended the watch, once it ended; None while it runs, or when it
        #: was stopped or its directory went.
        self.error: Optional[Exception] = None
        self._reading = _syncio.Background(self._read, "roche-watch")

    def _read(self) -> None:
        err: Optional[Exception] = None
        try:
            for ev in self._events:
                if ev is None:
                    continue
                if self._on_event is not None:
                    _syncio.call(self._on_event, ev)
                else:
                    self._keep(ev)
        except _syncio.Cancelled:
            raise
        except Exception as e:
            if not self._stopped:
                err = e
        finally:
            self.error = err
            self._arrived.set()
            if self._on_exit is not None:
                _syncio.call(self._on_exit, err)

    def _keep(self, ev: FilesystemEvent) -> None:
        with self._lock:
            if len(self._kept) >= WATCH_QUEUE:
                self._lost += 1 + (ev.lost if ev.type is FilesystemEventType.OVERFLOW else 0)
            else:
                if self._lost:
                    self._kept.append(FilesystemEvent("", FilesystemEventType.OVERFLOW, self._lost))
                    self._lost = 0
                self._kept.append(ev)
            self._arrived.set()

    def get_new_events(self) -> List[FilesystemEvent]:
        """The events since the last call (E2B's name), without waiting; losses, when the
        reader fell behind, as an overflow event. After the watch ended with an error,
        that error is raised once what was kept has been taken."""
        with self._lock:
            out = list(self._kept)
            self._kept.clear()
            if self._lost:
                out.append(FilesystemEvent("", FilesystemEventType.OVERFLOW, self._lost))
                self._lost = 0
            self._arrived.clear()
        if not out and self.error is not None and self._reading.done():
            raise self.error
        return out

    @property
    def running(self) -> bool:
        """The watch still runs."""
        return not self._reading.done()

    def _next(self) -> Optional[FilesystemEvent]:
        while True:
            with self._lock:
                if self._kept:
                    return self._kept.popleft()
                if self._lost:
                    ev = FilesystemEvent("", FilesystemEventType.OVERFLOW, self._lost)
                    self._lost = 0
                    return ev
                self._arrived.clear()
            if self._reading.done():
                if self.error is not None:
                    raise self.error
                return None
            _syncio.in_thread(self._arrived.wait, 0.5)

    def __iter__(self) -> Iterator[FilesystemEvent]:
        return self._iterate()

    def _iterate(self) -> Iterator[FilesystemEvent]:
        while True:
            ev = self._next()
            if ev is None:
                return
            yield ev

    def stop(self) -> None:
        """Ends the watch (an event on its way may still be kept)."""
        self._stopped = True
        self._abort()
        self._reading.wait(30)


class Files:
    """``sandbox.files``: read, write, list, stat and watch the sandbox's files, as its
    user. Paths are absolute; see the README's files section for what each call
    guarantees and its limits."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _t(self) -> Any:
        return self._sb._t

    def _deadline(self, request_timeout: Optional[float]) -> Deadline:
        if request_timeout is not None:
            return Deadline(request_timeout)
        d: Deadline = self._sb._roche._deadline()
        return d

    def _idle(self, request_timeout: Optional[float]) -> Deadline:
        return IdleDeadline(request_timeout if request_timeout is not None else self._sb._roche._choice.request_timeout)

    @overload
    def read(self, path: str, format: Literal["text"] = "text", *, max_bytes: Optional[int] = None,
             request_timeout: Optional[float] = None) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], *, max_bytes: Optional[int] = None,
             request_timeout: Optional[float] = None) -> bytearray: ...

    @overload
    def read(self, path: str, format: Literal["stream"], *, max_bytes: Optional[int] = None,
             request_timeout: Optional[float] = None) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text", *, max_bytes: Optional[int] = None,
             request_timeout: Optional[float] = None) -> Any:
        """A file's content: ``format="text"`` (str, UTF-8), ``"bytes"`` (bytearray) or
        ``"stream"`` (the pieces as they arrive: ``for piece in ...``; leaving the
        loop early ends the read). What is sent is the file as it was when the read
        began: what is appended meanwhile is not. A file over ``max_bytes`` (default
        roched's cap, 1 GiB) raises ResourceExhausted before any of it is sent; a
        directory, FIFO or device InvalidConfig; a symlink PermissionDenied.
        ``request_timeout`` bounds how long the read may go without progress."""
        check_path(path)
        if format not in ("text", "bytes", "stream"):
            raise RocheError(f'format {format!r}: give "text", "bytes" or "stream"')
        pieces = self._pieces(path, max_bytes, request_timeout)
        if format == "stream":
            return pieces
        buf = bytearray()
        for piece in pieces:
            buf += piece
        return buf.decode("utf-8", "replace") if format == "text" else buf

    def _pieces(self, path: str, max_bytes: Optional[int], request_timeout: Optional[float]) -> Iterator[bytes]:
        items = self._t().file_read(self._sb.id, path, self._idle(request_timeout), max_bytes)
        try:
            for item in items:
                if isinstance(item, bytes):
                    yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def write(self, path: str, data: Any, *, mode: int = 0o644, max_bytes: Optional[int] = None,
              request_timeout: Optional[float] = None) -> WriteInfo:
        """Writes ``data`` to the file at ``path``, replacing it and making its missing
        parent directories, and returns what was written (name, type, path, size, mode).
        ``data`` is str (UTF-8), bytes, a file opened for reading, or an iterable of bytes
        (in the async API an async iterable too), sent as it is read: nothing is held
        whole. More than ``max_bytes`` (default roched's cap, 1 GiB) or past the
        sandbox's disk space raises ResourceExhausted and leaves no file."""
        check_path(path)
        content = pieces_of(data)
        return self._t().file_write(self._sb.id, path, content, check_mode(mode), self._idle(request_timeout),
                                    max_bytes)

    def list(self, path: str, depth: Optional[int] = 1, *, request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """What is below the directory ``path``, to ``depth`` levels (1: its entries; at
        most 64), each directory's entries in name order before what is below them. A
        symlink is listed, not entered; more than 100,000 entries raises
        ResourceExhausted."""
        check_path(path)
        return self._t().file_list(self._sb.id, path, check_depth(depth), self._deadline(request_timeout))

    def get_info(self, path: str, *, request_timeout: Optional[float] = None) -> EntryInfo:
        """Describes ``path`` (a symlink itself, not what it points to); SandboxNotFound
        when it does not exist."""
        check_path(path)
        entry = self._t().file_stat(self._sb.id, path, self._deadline(request_timeout))
        assert entry is not None
        return entry

    #: Roche's name for get_info.
    stat = get_info

    def exists(self, path: str, *, request_timeout: Optional[float] = None) -> bool:
        """Whether ``path`` exists (a symlink counts, whatever it points to). A sandbox
        that is gone raises SandboxNotFound, never False."""
        check_path(path)
        return self._t().file_stat(self._sb.id, path, self._deadline(request_timeout), True) is not None

    def make_dir(self, path: str, *, request_timeout: Optional[float] = None) -> bool:
        """Makes the directory ``path`` and its missing parents; True when it made it,
        False when it was a directory already."""
        check_path(path)
        return self._t().file_mkdir(self._sb.id, path, self._deadline(request_timeout))

    def rename(self, old_path: str, new_path: str, *, request_timeout: Optional[float] = None) -> EntryInfo:
        """Moves ``old_path`` to ``new_path`` (a symlink is moved itself) and describes it
        there. Both must be on one filesystem of the sandbox (not /tmp to /workspace)."""
        check_path(old_path, "old_path")
        check_path(new_path, "new_path")
        return self._t().file_rename(self._sb.id, old_path, new_path, self._deadline(request_timeout))

    def remove(self, path: str, *, request_timeout: Optional[float] = None) -> None:
        """Removes ``path`` and, for a directory, everything below it (a symlink is
        removed itself, never what it points to)."""
        check_path(path)
        self._t().file_remove(self._sb.id, path, self._deadline(request_timeout))

    def watch_dir(self, path: str, on_event: Optional[OnEvent] = None, *, recursive: bool = False,
                  on_exit: Optional[OnExit] = None,
                  request_timeout: Optional[float] = None) -> WatchHandle:
        """Watches the directory ``path`` (and with ``recursive`` every directory below
        it, those made later included) and returns once the watch is in place: every
        change after it is reported, as a FilesystemEvent (create, write, remove, rename,
        chmod; overflow when events were dropped, with how many). Without ``on_event``
        the handle keeps them (``get_new_events()``, or iterate it). ``stop()`` ends it."""
        check_path(path)
        abort = Abort()
        events = self._t().file_watch(self._sb.id, path, recursive, self._idle(request_timeout), abort)
        try:
            first = events.__next__()
        except StopIteration:
            raise RocheError(f"the watch of {path} ended before it started") from None
        except BaseException:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            raise
        if first is not None:
            raise RocheError(f"the watch of {path} sent an event before it started")
        return WatchHandle(events, abort, on_event, on_exit)


__all__ = ["Files", "WatchHandle", "EntryInfo", "FileType", "FilesystemEvent", "FilesystemEventType",
           "WriteInfo"]
