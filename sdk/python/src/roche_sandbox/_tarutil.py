"""Tar streams for the daemon's CopyTo and CopyFrom, whose single root entry is the
file or directory copied. Extraction never writes outside its destination."""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
from typing import IO, Iterator

from .errors import InvalidConfig, RocheError, SandboxNotFound

#: Uploads and downloads are spooled in memory up to this size, then on disk.
SPOOL = 8 << 20


def base_name(sandbox_path: str, what: str) -> str:
    """The last element of an absolute sandbox path, refusing / and relative paths."""
    clean = posixpath.normpath(sandbox_path)
    if not sandbox_path.startswith("/") or clean == "/":
        raise InvalidConfig(f"{what} {sandbox_path!r} must be an absolute path below /, e.g. /tmp/data.txt")
    return posixpath.basename(clean)


def file_tar(name: str, data: bytes, mode: int) -> bytes:
    """A tar stream holding one regular file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tw:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode & 0o7777, int(time.time())
        tw.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The host's owners mean nothing in the sandbox: the extracting user owns the files.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def path_tar(src: str, name: str) -> IO[bytes]:
    """A tar stream of the host file or directory src with root entry name, rewound."""
    if not os.path.lexists(src):
        raise SandboxNotFound(f"not found: host path {src} does not exist")
    out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tw:
        tw.add(src, arcname=name, recursive=True, filter=_anonymous)
    out.seek(0)
    return out


def chunks(f: IO[bytes], size: int) -> Iterator[bytes]:
    """Reads f in pieces of size."""
    while True:
        b = f.read(size)
        if not b:
            return
        yield b


def file_from_tar(f: IO[bytes], src: str) -> bytes:
    """The content of the single regular file a CopyFrom tar stream holds."""
    with tarfile.open(fileobj=f, mode="r|") as tr:
        for member in tr:
            if member.isdir():
                raise RocheError(f"{src} is a directory: read_file reads files; use copy_from for directories")
            if not member.isfile():
                raise RocheError(f"{src} is not a regular file: read_file reads regular files")
            r = tr.extractfile(member)
            return r.read() if r is not None else b""
    raise RocheError(f"reading {src}: the sandbox sent an empty archive")


def _inside(root: str, target: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def _no_symlink_between(root: str, target: str) -> None:
    # Writing through a symlink planted by an earlier entry could escape root.
    rel = os.path.relpath(target, root)
    p = root
    for part in rel.split(os.sep)[:-1]:
        if part in ("", "."):
            continue
        p = os.path.join(p, part)
        if os.path.islink(p):
            raise RocheError(f"archive writes through the symlink {p}: refused")


def extract(f: IO[bytes], dst: str) -> None:
    """Recreates the tar stream's root entry at the host path dst."""
    root = os.path.abspath(dst)
    seen = False
    with tarfile.open(fileobj=f, mode="r|") as tr:
        for member in tr:
            seen = True
            raw = member.name[2:] if member.name.startswith("./") else member.name
            name = posixpath.normpath(raw or ".")
            if raw.startswith("/") or name == ".." or name.startswith("../"):
                raise RocheError(f"archive entry {member.name!r} points outside the destination: refused")
            _, _, rest = name.partition("/")
            target = os.path.abspath(os.path.join(root, *rest.split("/"))) if rest else root
            if not _inside(root, target):
                raise RocheError(f"archive entry {member.name!r} points outside the destination: refused")
            _no_symlink_between(root, target)
            mode = member.mode & 0o777
            if member.isdir():
                os.makedirs(target, mode=mode | 0o700, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.islink(target):
                    os.remove(target)
                r = tr.extractfile(member)
                with open(target, "wb") as w:
                    if r is not None:
                        shutil.copyfileobj(r, w)
                os.chmod(target, mode)
            elif member.issym():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.lexists(target):
                    os.remove(target)
                os.symlink(member.linkname, target)
    if not seen:
        raise RocheError(f"copying to {dst}: the sandbox sent an empty archive")
