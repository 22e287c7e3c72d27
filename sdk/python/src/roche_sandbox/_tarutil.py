"""Tar streams for the daemon's CopyTo and CopyFrom, whose single root entry is the
file or directory copied, made and unpacked the way Roche's Go side does it (its
internal/tarfs), since both ends are hostile:

- Reading a host tree to upload never follows a symlink below the path given: each file
  and directory is opened relative to its parent's descriptor with O_NOFOLLOW and
  described by fstat of what was opened, so sandboxed code swapping a file for a symlink
  in a read-write mount cannot make the copy read anything outside it. Symlinks are sent
  as symlinks.
- Unpacking never follows a symlink at or below the destination (one there is replaced),
  refuses absolute names, ".." and a second root, makes symlinks only when asked and only
  those pointing inside the destination, never makes devices or fifos, refuses the file
  that would take the copy past its cap before writing any of it, and keeps runs of zeros
  as holes.
- Everything streams: nothing is spooled whole in memory or on disk."""

from __future__ import annotations

import errno
import io
import os
import posixpath
import queue
import stat
import tarfile
import threading
import time
from typing import IO, Callable, Iterable, Iterator, Optional

from .errors import InvalidConfig, PermissionDenied, ResourceExhausted, RocheError, SandboxNotFound
from .types import DEFAULT_COPY_MAX_BYTES, CopyReport, SkippedEntry

_NOFOLLOW_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 256 << 10
_HOLE = 4096
_ZEROS = bytes(_HOLE)
_MAX_EXAMPLES = 5


def base_name(sandbox_path: str, what: str) -> str:
    """The last element of an absolute sandbox path, refusing / and relative paths."""
    clean = posixpath.normpath(sandbox_path)
    if not sandbox_path.startswith("/") or clean == "/":
        raise InvalidConfig(f"{what} {sandbox_path!r} must be an absolute path below /, e.g. /tmp/data.txt")
    return posixpath.basename(clean)


def limit(max_bytes: Optional[int]) -> int:
    """The cap a max_bytes argument sets: None means the default, 1 GiB."""
    if max_bytes is None:
        return DEFAULT_COPY_MAX_BYTES
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
        raise InvalidConfig(f"max_bytes {max_bytes!r} must be a positive number of bytes, e.g. 4 << 30")
    return max_bytes


def size_text(n: int) -> str:
    """A byte count for people: "1 GiB", "10 TiB", "1.5 MiB", "17 bytes" (as the Go side)."""
    if n < 1024:
        return f"{n} bytes"
    v, unit = n / 1024, 0
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    while v >= 1024 and unit < len(units) - 1:
        v /= 1024
        unit += 1
    return f"{int(v)} {units[unit]}" if v == int(v) else f"{v:.1f} {units[unit]}"


def _over(name: str, size: int, cap: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"resource exhausted: {name} is {size_text(size)}, which takes the copy past its limit of "
        f"{size_text(cap)}: copy less, or raise the cap with max_bytes=")


def file_tar(name: str, data: bytes, mode: int) -> bytes:
    """A tar stream holding one regular file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tw:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode & 0o777, int(time.time())
        tw.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Report:
    """What a copy moved and left out, as it goes."""

    def __init__(self) -> None:
        self.files = self.dirs = self.links = self.bytes = self.skipped = self.skipped_links = 0
        self.examples: list[SkippedEntry] = []

    def skip(self, path: str, target: str, reason: str) -> None:
        self.skipped += 1
        if reason != "special":
            self.skipped_links += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(SkippedEntry(path, target, reason))

    def freeze(self, extra: Optional[CopyReport] = None) -> CopyReport:
        examples = list(self.examples)
        skipped, links = self.skipped, self.skipped_links
        if extra is not None:
            examples = (list(extra.examples) + examples)[:_MAX_EXAMPLES]
            skipped += extra.skipped
            links += extra.skipped_links
        return CopyReport(self.files, self.dirs, self.links, self.bytes, skipped, links, tuple(examples))


def _header(name: str, kind: bytes, st: os.stat_result, size: int = 0, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, linkname
    info.mode = 0o777 if kind == tarfile.SYMTYPE else stat.S_IMODE(st.st_mode) & 0o777
    info.mtime = int(st.st_mtime)
    # The host's owners mean nothing in the sandbox: the extracting user owns the files.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def path_tar(src: str, name: str, max_bytes: int, report: Optional[Report] = None) -> Iterator[bytes]:
    """The tar stream of the host file or directory src, root entry name, as it is read.
    src's own parent path is taken as given; nothing below it is followed."""
    src = os.path.abspath(src)
    if not os.path.lexists(src):
        raise SandboxNotFound(f"not found: host path {src} does not exist")
    parent, base = os.path.split(src)
    if src == "/":
        parent, base = "/", "."
    rep = report if report is not None else Report()
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield from _walk(pfd, base, name, src, rep, max_bytes)
    except RocheError:
        raise
    except OSError as e:
        # Not a transport failure: say which file, so it is not taken for an unreachable daemon.
        raise RocheError(f"reading {e.filename or src} to copy it: {e.strerror or e}") from None
    finally:
        os.close(pfd)
    yield bytes(1024)  # the end of the archive


def _walk(dirfd: int, child: str, arc: str, shown: str, rep: Report, cap: int) -> Iterator[bytes]:
    # A few tries: the sandbox may swap the entry while we look; each try describes what
    # was actually opened, so a lost race is a retry, never a followed link.
    for _ in range(4):
        try:
            st = os.stat(child, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            if "/" not in arc:
                raise SandboxNotFound(f"not found: host path {shown} does not exist") from None
            return  # removed since its directory was listed: as tar does, go on without it
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(child, dir_fd=dirfd)
            except OSError as e:
                if e.errno in (errno.EINVAL, errno.ENOENT):
                    continue  # no longer a symlink
                raise
            rep.links += 1
            yield _header(arc, tarfile.SYMTYPE, st, linkname=target)
            return
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            rep.skip(shown, "", "special")  # not even opened: for a device that could do something
            return
        try:
            fd = os.open(child, _NOFOLLOW_OPEN, dir_fd=dirfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOENT):
                continue  # swapped for a symlink (or removed) since the stat
            raise
        try:
            yield from _opened(fd, arc, shown, rep, cap)
        finally:
            os.close(fd)
        return
    raise RocheError(f"{shown} kept changing while it was copied")


def _opened(fd: int, arc: str, shown: str, rep: Report, cap: int) -> Iterator[bytes]:
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        size = st.st_size
        if size > cap - rep.bytes:
            raise _over(shown, size, cap)
        yield _header(arc, tarfile.REGTYPE, st, size=size)
        left = size
        while left:
            b = os.read(fd, min(_CHUNK, left))
            if not b:
                raise RocheError(f"{shown} shrank while it was copied")
            left -= len(b)
            yield b
        if size % 512:
            yield bytes(512 - size % 512)
        rep.files += 1
        rep.bytes += size
    elif stat.S_ISDIR(st.st_mode):
        yield _header(arc + "/", tarfile.DIRTYPE, st)
        rep.dirs += 1
        for n in sorted(os.listdir(fd)):
            yield from _walk(fd, n, arc + "/" + n, os.path.join(shown, n), rep, cap)
    else:
        rep.skip(shown, "", "special")


class ChunkReader(io.RawIOBase):
    """A readable file over an iterable of byte chunks (a download's pieces)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: "bytearray | memoryview") -> int:  # type: ignore[override]
        while not self._rest:
            try:
                self._rest = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._rest))
        b[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


class Abandoned(Exception):
    """The reading side of a PipeReader has finished."""


class PipeReader(io.RawIOBase):
    """A readable file fed from another thread (the async transport's event loop feeds
    chunks while a worker thread unpacks them); feed() blocks while 16 chunks wait."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Optional[bytes]]" = queue.Queue(maxsize=16)
        self._rest = b""
        self._eof = False
        self._error: Optional[Exception] = None
        self.abandoned = threading.Event()

    def fail(self, error: Exception) -> None:
        """Makes the reader's next read raise error (the download failed)."""
        self._error = error

    def readable(self) -> bool:
        return True

    def feed(self, chunk: Optional[bytes]) -> None:
        """Hands over the next chunk (None: the end); raises Abandoned if the reader is done."""
        while True:
            if self.abandoned.is_set():
                raise Abandoned()
            try:
                self._q.put(chunk, timeout=0.1)
                return
            except queue.Full:
                continue

    def readinto(self, b: "bytearray | memoryview") -> int:  # type: ignore[override]
        while not self._rest:
            if self._eof:
                return 0
            if self._error is not None:
                raise self._error
            try:
                chunk = self._q.get(timeout=0.1)
            except queue.Empty:
                continue
            if chunk is None:
                self._eof = True
            else:
                self._rest = chunk
        n = min(len(b), len(self._rest))
        b[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def file_from_tar(f: IO[bytes], src: str, max_bytes: int,
                  skipped_upstream: Optional[Callable[[], CopyReport]] = None) -> bytes:
    """The content of the single regular file a CopyFrom tar stream holds, refused before
    any of it is read when it is over max_bytes. The stream is read to its end, after
    which skipped_upstream says what the daemon left out (a symlink, say)."""
    data = _first_file(f, src, max_bytes)
    while f.read(_CHUNK):
        pass
    if data is None:
        upstream = skipped_upstream() if skipped_upstream is not None else None
        if upstream is not None and upstream.skipped_links:
            raise PermissionDenied(f"permission denied: {src} is a symlink, which the files API does not follow")
        raise RocheError(f"reading {src}: the sandbox sent an empty archive")
    return data


def _first_file(f: IO[bytes], src: str, max_bytes: int) -> Optional[bytes]:
    with tarfile.open(fileobj=f, mode="r|") as tr:
        for member in tr:
            if member.isdir():
                raise InvalidConfig(f"invalid config: {src} is a directory: read_file reads files; use copy_from for directories")
            if member.issym():
                raise PermissionDenied(f"permission denied: {src} is a symlink, which the files API does not follow")
            if not member.isreg():
                raise InvalidConfig(f"invalid config: {src} is not a regular file: read_file reads regular files")
            if member.size > max_bytes:
                raise _over(src, member.size, max_bytes)
            r = tr.extractfile(member)
            return r.read() if r is not None else b""
    return None


def _link_inside(rest: list[str], target: str) -> bool:
    """Whether a symlink at rest (below the destination's root) pointing to target stays
    inside: relative, its ".." all first, no more of them than directories above it."""
    if not rest or not target or target.startswith("/"):
        return False
    ups, named = 0, False
    for p in target.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if named:
                return False
            ups += 1
        else:
            named = True
    return ups <= len(rest) - 1


class _Extractor:
    def __init__(self, base: int, display: str, prefix: list[str], cap: int, preserve_links: bool,
                 where: str) -> None:
        self.base, self.display, self.prefix = base, display, prefix
        self.cap, self.preserve_links, self.where = cap, preserve_links, where
        self.rep = Report()
        self.root = ""
        self.seen = False

    def shown(self, parts: list[str]) -> str:
        return os.path.join(self.display, *parts)

    def source(self, name: str) -> str:
        return posixpath.join(self.where, name)

    def run(self, f: IO[bytes]) -> None:
        with tarfile.open(fileobj=f, mode="r|") as tr:
            for member in tr:
                self.seen = True
                self.entry(tr, member)

    def entry(self, tr: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        raw = m.name[2:] if m.name.startswith("./") else m.name
        if raw.startswith("/"):
            raise PermissionDenied(f"permission denied: archive entry {m.name!r} has an absolute name: refused")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts or not parts:
            raise PermissionDenied(f"permission denied: archive entry {m.name!r} points outside the destination: refused")
        if not self.root:
            self.root = parts[0]
        elif parts[0] != self.root:
            raise PermissionDenied(f"permission denied: archive entry {m.name!r} is outside its root {self.root!r}")
        rest = parts[1:]
        if m.isreg():
            if m.size > self.cap - self.rep.bytes:
                raise _over(self.source(m.name), m.size, self.cap)
        elif m.issym():
            if not self.preserve_links:
                self.rep.skip(self.source(m.name), m.linkname, "symlink")
                return
            if not _link_inside(rest, m.linkname):
                self.rep.skip(self.source(m.name), m.linkname, "outside")
                return
        elif not m.isdir():
            self.rep.skip(self.source(m.name), m.linkname, "special")
            return
        full = self.prefix + rest
        parent = self.dir_of(full[:-1])
        try:
            name, shown = full[-1], self.shown(full)
            if m.isdir():
                os.close(_open_dir(parent, name, (m.mode & 0o777) | 0o700, shown))
                self.rep.dirs += 1
            elif m.issym():
                _remove_non_dir(parent, name, shown)
                os.symlink(m.linkname, name, dir_fd=parent)
                self.rep.links += 1
            else:
                r = tr.extractfile(m)
                _write_file(parent, name, shown, r, m.size, m.mode & 0o777)
                self.rep.files += 1
                self.rep.bytes += m.size
        finally:
            if parent != self.base:
                os.close(parent)

    def dir_of(self, parts: list[str]) -> int:
        cur = self.base
        for i, p in enumerate(parts):
            fd = _open_dir(cur, p, 0o755, self.shown(parts[:i + 1]))
            if cur != self.base:
                os.close(cur)
            cur = fd
        return cur


def _open_dir(dirfd: int, name: str, mode: int, shown: str) -> int:
    """Opens directory name without following a symlink, making it when missing; a
    symlink there is removed and replaced, never followed; anything else is an error."""
    for _ in range(5):
        try:
            return os.open(name, _DIR_OPEN, dir_fd=dirfd)
        except FileNotFoundError:
            try:
                os.mkdir(name, mode, dir_fd=dirfd)
            except FileExistsError:
                pass
            continue
        except OSError as e:
            if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(st.st_mode):
            raise InvalidConfig(f"invalid config: {shown} exists and the archive has a directory there: remove it or copy to another path")
        try:
            os.unlink(name, dir_fd=dirfd)
        except FileNotFoundError:
            pass
    raise RocheError(f"{shown} kept changing while the copy was creating it")


def _remove_non_dir(dirfd: int, name: str, shown: str) -> None:
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidConfig(f"invalid config: {shown} is a directory and the archive has a file there: remove it or copy to another path") from None
        raise


def _write_file(dirfd: int, name: str, shown: str, r: Optional[IO[bytes]], size: int, mode: int) -> None:
    """Creates name afresh (whatever was there, a symlink included, is removed first) and
    writes size bytes of r, seeking over all-zero blocks so holes stay holes."""
    for attempt in range(4):
        _remove_non_dir(dirfd, name, shown)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
            break
        except FileExistsError:
            if attempt == 3:
                raise
    try:
        off = 0
        while off < size:
            data = r.read(min(_CHUNK, size - off)) if r is not None else b""
            if not data:
                raise RocheError(f"writing {shown}: the archive ended inside it")
            i = 0
            while i < len(data):
                end = min(i + _HOLE, len(data))
                if data[i:end] == _ZEROS[:end - i]:
                    i = end
                    continue
                j = end
                while j < len(data):
                    e = min(j + _HOLE, len(data))
                    if data[j:e] == _ZEROS[:e - j]:
                        break
                    j = e
                os.pwrite(fd, data[i:j], off + i)
                i = j
            off += len(data)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def extract(f: IO[bytes], dst: str, max_bytes: int, preserve_links: bool, where: str,
            skipped_upstream: Optional[Callable[[], CopyReport]] = None) -> CopyReport:
    """Recreates the tar stream's root entry at the host path dst; where is the sandbox
    directory the entries came from (for the report). The stream is read to its end.
    skipped_upstream, called then, says what the daemon already left out: an archive it
    emptied is not an error."""
    dst = os.path.abspath(dst)
    if dst == "/":
        raise InvalidConfig("invalid config: the destination cannot be /: name a file or directory to create")
    parent, base = os.path.split(dst)
    os.makedirs(parent, exist_ok=True)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    x = _Extractor(pfd, parent, [base], max_bytes, preserve_links, where)
    try:
        x.run(f)
        # To the end: a relay's verdict (an error, what it left out) comes last.
        while f.read(_CHUNK):
            pass
    except RocheError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceExhausted(f"resource exhausted: copying to {dst}: no space left on the host: {e}") from None
        raise RocheError(f"copying to {dst}: {e}") from None
    finally:
        os.close(pfd)
    upstream = skipped_upstream() if skipped_upstream is not None else None
    if not x.seen and not (upstream and upstream.skipped):
        raise RocheError(f"copying to {dst}: the sandbox sent an empty archive")
    return x.rep.freeze(upstream)
