"""Where roched and the roche CLI are, by the CLI's own rules."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from .errors import InvalidConfig


def default_socket() -> str:
    """$ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock."""
    s = os.environ.get("ROCHE_SOCKET")
    if s:
        return s
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "roche", "roched.sock")
    home = os.path.expanduser("~")
    if home and home != "~":
        return os.path.join(home, ".roche", "roched.sock")
    return os.path.join(tempfile.gettempdir(), f"roche-{os.getuid()}", "roched.sock")


def find_cli(explicit: Optional[str] = None) -> Optional[str]:
    """The roche CLI: the one given, else $ROCHE_CLI, else roche on PATH."""
    path = explicit or os.environ.get("ROCHE_CLI")
    if path:
        return path
    return shutil.which("roche")


@dataclass(frozen=True)
class Endpoint:
    """How to reach roched: a unix socket, or a TCP address with a token."""

    socket: Optional[str] = None
    host: str = ""
    port: int = 0
    tls: bool = False
    token: Optional[str] = None

    @property
    def where(self) -> str:
        """For messages: the socket path or the address."""
        if self.socket:
            return self.socket
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


def endpoint(socket: Optional[str], address: Optional[str], token: Optional[str]) -> Endpoint:
    """The endpoint for Roche's socket=, address= and token= arguments."""
    token = token or os.environ.get("ROCHE_TOKEN") or None
    if not address:
        return Endpoint(socket=socket or default_socket(), token=token)
    u = urlsplit(address)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise InvalidConfig(f"daemon address {address!r}: use http://HOST:PORT, e.g. http://127.0.0.1:7878")
    port = u.port or (443 if u.scheme == "https" else 80)
    return Endpoint(host=u.hostname, port=port, tls=u.scheme == "https", token=token)
