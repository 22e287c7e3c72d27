"""The files API's values and wire forms, shared by both halves of the SDK: the entries
and events it hands back (named as E2B's SDKs name them), roched's messages for them
(file content in binary protobuf, the rest in JSON) and the roche CLI's arguments and
output for them. No I/O here."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import struct
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Iterable, Iterator, Optional, Union

from .errors import InvalidConfig, RocheError

#: The most content one WriteFile message carries (roched reads file content in pieces
#: of this size too).
FILE_CHUNK = 256 << 10
#: The deepest a listing may go.
MAX_LIST_DEPTH = 64
#: Events a watch handle holds for a reader that does not take them; past it they are
#: dropped and counted in an overflow event.
WATCH_QUEUE = 10_000

PROTO_STREAM_HEADERS = {"Content-Type": "application/connect+proto", "Connect-Protocol-Version": "1"}


class FileType(Enum):
    """What a path is."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    #: A FIFO, socket or device node: the files API neither reads nor writes them.
    OTHER = "other"


@dataclass(frozen=True)
class EntryInfo:
    """A path in the sandbox, as ``files.get_info`` and ``files.list`` describe it (E2B's
    EntryInfo). No symlink is followed: a symlink is described itself, its target in
    ``symlink_target``."""

    name: str
    type: Optional[FileType]
    path: str
    size: int = 0
    #: The permission bits (0o777 at most).
    mode: int = 0
    #: Type and mode as ``ls -l`` shows them, the way Go prints them: "-rw-r--r--",
    #: "drwxr-xr-x", "Lrwxrwxrwx" (a symlink).
    permissions: str = ""
    #: Names of uid and gid in the sandbox's /etc/passwd and /etc/group ("" if none).
    owner: str = ""
    group: str = ""
    modified_time: Optional[datetime] = None
    symlink_target: Optional[str] = None
    uid: int = 0
    gid: int = 0


#: What ``files.write`` returns: the file written (name, type, path, size and mode).
WriteInfo = EntryInfo


class FilesystemEventType(Enum):
    """What happened to a path below a watched directory."""

    CHMOD = "chmod"
    CREATE = "create"
    REMOVE = "remove"
    #: The old name of a rename (its new one, inside the watched tree, comes as CREATE).
    RENAME = "rename"
    WRITE = "write"
    #: Events were dropped because the reader fell behind; ``lost`` counts them (0 when
    #: the count is unknown). Never silent.
    OVERFLOW = "overflow"


@dataclass(frozen=True)
class FilesystemEvent:
    """One change below a watched directory."""

    #: The path relative to the watched directory ("" for the directory itself, in the
    #: last event of a watch whose directory was removed or renamed).
    name: str
    type: FilesystemEventType
    lost: int = 0


_FILE_TYPES = {1: FileType.FILE, 2: FileType.DIR, 3: FileType.SYMLINK, 4: FileType.OTHER,
               "FILE_TYPE_FILE": FileType.FILE, "FILE_TYPE_DIRECTORY": FileType.DIR,
               "FILE_TYPE_SYMLINK": FileType.SYMLINK, "FILE_TYPE_OTHER": FileType.OTHER,
               "file": FileType.FILE, "dir": FileType.DIR, "symlink": FileType.SYMLINK}
_EVENT_TYPES = {"FILE_EVENT_TYPE_CREATE": FilesystemEventType.CREATE, "FILE_EVENT_TYPE_WRITE": FilesystemEventType.WRITE,
                "FILE_EVENT_TYPE_REMOVE": FilesystemEventType.REMOVE, "FILE_EVENT_TYPE_RENAME": FilesystemEventType.RENAME,
                "FILE_EVENT_TYPE_CHMOD": FilesystemEventType.CHMOD,
                "FILE_EVENT_TYPE_OVERFLOW": FilesystemEventType.OVERFLOW}


def check_path(path: str, what: str = "path") -> str:
    """Refuses what roched would: a path not absolute, with "..", or with a NUL."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidConfig(f"invalid config: {what} {path!r} is not absolute: give a path starting with /, e.g. /tmp/data.txt")
    if ".." in path.split("/"):
        raise InvalidConfig(f'invalid config: {what} {path!r} climbs with "..": give the path it means without it')
    if "\x00" in path:
        raise InvalidConfig(f"invalid config: {what} holds a NUL byte")
    return path


def check_depth(depth: Optional[int]) -> int:
    if depth is None:
        return 1
    if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= MAX_LIST_DEPTH:
        raise InvalidConfig(f"invalid config: depth {depth!r}: give 1 (the directory's entries) to {MAX_LIST_DEPTH}")
    return depth


def check_mode(mode: int) -> int:
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
        raise InvalidConfig(f"invalid config: mode {mode!r}: give permission bits, at most 0o777")
    return mode


class Abort:
    """How a watch is broken off from another thread (or task): the transport says how
    (set), the handle's stop() does it (call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fn: Optional[Any] = None
        self._done = False

    def set(self, fn: Any) -> None:
        with self._lock:
            if not self._done:
                self._fn = fn
                return
        fn()

    def __call__(self) -> None:
        with self._lock:
            self._done = True
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


# --- roched: JSON for the unary calls and watches -------------------------------------


def _time(s: Any) -> Optional[datetime]:
    from ._wire import parse_time  # the one parser of the API's timestamps
    return parse_time(s) if isinstance(s, str) else None


def entry_from_json(m: Any) -> EntryInfo:
    """A FileEntry of roched's JSON."""
    if not isinstance(m, dict):
        m = {}
    path = str(m.get("path", ""))
    target = m.get("symlinkTarget") or None
    return EntryInfo(
        name=str(m.get("name") or posixpath.basename(path)), type=_FILE_TYPES.get(m.get("type", "")), path=path,
        size=int(m.get("size", 0) or 0), mode=int(m.get("mode", 0) or 0), permissions=str(m.get("permissions", "")),
        owner=str(m.get("owner", "")), group=str(m.get("group", "")), modified_time=_time(m.get("modifiedTime")),
        symlink_target=target, uid=int(m.get("uid", 0) or 0), gid=int(m.get("gid", 0) or 0))


def event_from_json(m: Any) -> Optional[FilesystemEvent]:
    """A FileEvent of roched's JSON (None for a type this SDK does not know)."""
    t = _EVENT_TYPES.get(m.get("type", "") if isinstance(m, dict) else "")
    if t is None:
        return None
    return FilesystemEvent(name=str(m.get("name", "")), type=t, lost=int(m.get("lost", 0) or 0))


def watch_item(m: dict[str, Any]) -> tuple[bool, Optional[FilesystemEvent]]:
    """A WatchDir message: (it says the watch started, the event it carries)."""
    if "started" in m:
        return True, None
    if "file" in m:
        return False, event_from_json(m["file"])
    return False, None


# --- roched: binary protobuf for file content -----------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(num: int, b: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(b)) + b


def _field_varint(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v) if v else b""


def proto_envelope(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


def read_request(sandbox_id: str, path: str, max_bytes: int) -> bytes:
    """A ReadFileRequest envelope, in binary protobuf."""
    return proto_envelope(_field_bytes(1, sandbox_id.encode()) + _field_bytes(2, path.encode())
                          + _field_varint(3, max_bytes))


class WriteEncoder:
    """WriteFileRequest envelopes, in binary protobuf, of content fed to it in pieces: the
    first names the file, each carries up to FILE_CHUNK of the content as it comes."""

    def __init__(self, sandbox_id: str, path: str, mode: int, max_bytes: int) -> None:
        self._head = (_field_bytes(1, sandbox_id.encode()) + _field_bytes(2, path.encode())
                      + _field_varint(3, mode) + _field_varint(4, max_bytes))
        self._buf = bytearray()
        self.size = 0

    def feed(self, piece: bytes) -> list[bytes]:
        self.size += len(piece)
        if not self._buf and len(piece) >= FILE_CHUNK:
            out = []
            for off in range(0, len(piece) - FILE_CHUNK + 1, FILE_CHUNK):
                out.append(self._message(piece[off:off + FILE_CHUNK]))
            self._buf += piece[len(out) * FILE_CHUNK:]
            return out
        self._buf += piece
        out = []
        while len(self._buf) >= FILE_CHUNK:
            out.append(self._message(bytes(self._buf[:FILE_CHUNK])))
            del self._buf[:FILE_CHUNK]
        return out

    def finish(self) -> list[bytes]:
        if self._buf or self._head:
            m = self._message(bytes(self._buf))
            self._buf = bytearray()
            return [m]
        return []

    def _message(self, data: bytes) -> bytes:
        body = self._head + (_field_bytes(5, data) if data else b"")
        self._head = b""
        return proto_envelope(body)


def _fields(raw: bytes) -> dict[int, Any]:
    from ._wire import _proto_fields  # the one protobuf reader of the SDK
    f = _proto_fields(raw)
    if f is None:
        raise RocheError("roched sent a malformed file message")
    return f


def _s(f: dict[int, Any], n: int) -> str:
    v = f.get(n, b"")
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else ""


def entry_from_proto(raw: bytes) -> EntryInfo:
    """A FileEntry of roched's binary protobuf."""
    f = _fields(raw)
    modified = None
    if 9 in f:
        t = _fields(f[9])
        modified = datetime.fromtimestamp(t.get(1, 0) + t.get(2, 0) / 1e9, tz=timezone.utc).astimezone()
    path = _s(f, 3)
    return EntryInfo(name=_s(f, 1) or posixpath.basename(path), type=_FILE_TYPES.get(f.get(2, 0)), path=path,
                     size=int(f.get(4, 0)), mode=int(f.get(5, 0)), permissions=_s(f, 6), owner=_s(f, 7),
                     group=_s(f, 8), modified_time=modified, symlink_target=_s(f, 10) or None,
                     uid=int(f.get(11, 0)), gid=int(f.get(12, 0)))


def read_item(raw: bytes) -> tuple[Optional[EntryInfo], bytes]:
    """A ReadFileResponse: (its entry, in the first message, or None; its data). The data
    field, nearly every message, is read without building the rest."""
    if raw[:1] == b"\x12":
        i, n, shift = 1, 0, 0
        while True:
            b = raw[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        if i + n == len(raw):
            return None, raw[i:]
    f = _fields(raw)
    entry = entry_from_proto(f[1]) if 1 in f else None
    return entry, bytes(f.get(2, b""))


def write_response(raw: bytes) -> EntryInfo:
    """The entry of a WriteFileResponse."""
    f = _fields(raw)
    return entry_from_proto(f[1]) if 1 in f else EntryInfo(name="", type=FileType.FILE, path="")


# --- what write() takes ----------------------------------------------------------------


def pieces_of(data: Any) -> Union[bytes, Iterator[bytes], Any]:
    """The content of write(data): bytes for str, bytes and the like (sent as they are), a
    generator of pieces for a file-like object (read FILE_CHUNK at a time) or an iterable
    of bytes; an async iterable is returned as it is (the async API iterates it)."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return _read_file(data)
    if hasattr(data, "__aiter__"):
        return data
    if hasattr(data, "__iter__"):
        return _checked(data)
    raise InvalidConfig(f"invalid config: write() takes str, bytes, a file opened for reading or an iterable of bytes, not {type(data).__name__}")


def _read_file(f: Any) -> Iterator[bytes]:
    while True:
        b = f.read(FILE_CHUNK)
        if not b:
            return
        if isinstance(b, str):
            b = b.encode()
        yield bytes(b)


def _checked(it: Iterable[Any]) -> Iterator[bytes]:
    for piece in it:
        if isinstance(piece, str):
            piece = piece.encode()
        if not isinstance(piece, (bytes, bytearray, memoryview)):
            raise InvalidConfig(f"invalid config: write() got a piece of {type(piece).__name__}: an iterable must yield bytes")
        yield bytes(piece)


# --- the roche CLI -----------------------------------------------------------------------


def cli_read_args(sid: str, path: str, max_bytes: Optional[int]) -> list[str]:
    args = ["files", "cat"]
    if max_bytes:
        args += ["--max-bytes", str(max_bytes)]
    return args + [sid, path]


def cli_write_args(sid: str, path: str, mode: int, max_bytes: Optional[int]) -> list[str]:
    args = ["files", "write", "--json", "--mode", f"{mode:o}"]
    if max_bytes:
        args += ["--max-bytes", str(max_bytes)]
    return args + [sid, path]


def entry_from_cli(m: Any) -> EntryInfo:
    """An entry as `roche files ... --json` prints it."""
    if not isinstance(m, dict):
        raise RocheError(f"roche printed an entry that is not a JSON object: {str(m)[:200]}")
    t = m.get("type")
    return EntryInfo(
        name=str(m.get("name", "")), type=_FILE_TYPES.get(t, FileType.OTHER if t else None), path=str(m.get("path", "")),
        size=int(m.get("size", 0)), mode=int(str(m.get("mode", "0")), 8), permissions=str(m.get("permissions", "")),
        owner=str(m.get("owner", "")), group=str(m.get("group", "")), modified_time=_time(m.get("modified_time")),
        symlink_target=m.get("symlink_target") or None, uid=int(m.get("uid", 0)), gid=int(m.get("gid", 0)))


def entries_from_cli(out: bytes) -> list[EntryInfo]:
    try:
        arr = json.loads(out or b"[]")
    except ValueError:
        raise RocheError(f"roche files ls printed what is not JSON: {out[:200]!r}") from None
    return [entry_from_cli(m) for m in arr or []]


def event_from_cli(line: bytes) -> tuple[bool, Optional[FilesystemEvent]]:
    """A line of `roche files watch --json`: (it says the watch started, its event)."""
    try:
        m = json.loads(line)
    except ValueError:
        raise RocheError(f"roche files watch printed what is not JSON: {line[:200]!r}") from None
    if m.get("type") == "started":
        return True, None
    try:
        t = FilesystemEventType(m.get("type"))
    except ValueError:
        return False, None
    return False, FilesystemEvent(name=str(m.get("name", "")), type=t, lost=int(m.get("lost", 0)))


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def is_file_like(data: Any) -> bool:
    return hasattr(data, "read") and not isinstance(data, (str, bytes, bytearray, os.PathLike))
