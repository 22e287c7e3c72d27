"""Where roched and the roche CLI are, by the CLI's own rules."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlsplit

from . import _tls
from .errors import InvalidConfig, ProviderUnavailable


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


#: Where a wheel from `make dist` carries roche (with roched and roche-agent beside it).
BUNDLED_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "roche")


def find_cli(explicit: Optional[str] = None) -> Optional[str]:
    """The roche CLI: the one given, else $ROCHE_CLI, else the one this package's wheel
    carries, else roche on PATH."""
    path = explicit or os.environ.get("ROCHE_CLI")
    if path:
        return path
    if os.access(BUNDLED_CLI, os.X_OK):
        return BUNDLED_CLI
    return shutil.which("roche")


@dataclass(frozen=True)
class Endpoint:
    """How to reach roched: a unix socket, or a TCP address with a token."""

    socket: Optional[str] = None
    host: str = ""
    port: int = 0
    tls: bool = False
    token: Optional[str] = None
    #: W3C traceparent sent with every call to roched, so that its spans are children of
    #: the caller's (docs/traces.md); checked by check_traceparent.
    traceparent: Optional[str] = None
    #: Verifies roched at an https:// address (ca=, ROCHE_CA_FILE or the system's CAs)
    #: and presents the client certificate, if any.
    ssl_context: Optional[ssl.SSLContext] = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        """For messages: the socket path or the address."""
        if self.socket:
            return self.socket
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def unreachable(self, err: BaseException) -> ProviderUnavailable:
        """The error for a roched that cannot be reached: a TLS failure said as such."""
        failure = _tls.problem(self.where, err)
        if failure is not None:
            return failure
        e = ProviderUnavailable(
            f"roched is not answering on {self.where}: start it (roche daemon start), "
            f"or let the SDK use the roche CLI (transport='cli'): {err}"
        )
        e.lost = "refused"  # _retry.REFUSED
        return e

    def broke_off(self, err: BaseException) -> ProviderUnavailable:
        """The error for a call whose connection failed midway."""
        failure = _tls.problem(self.where, err)
        if failure is not None:
            return failure
        e = ProviderUnavailable(f"roched on {self.where} broke off the call: {err} (is it still running?)")
        e.lost = "broke"  # _retry.BROKE
        return e


def read_token_file(path: str) -> str:
    """The token in a file only its owner can read (as roched's --token-file): a token
    readable by others is anyone's, so such a file is refused rather than used."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise InvalidConfig(f"token file {path}: {e.strerror or e}") from None
    if st.st_mode & 0o077:
        raise InvalidConfig(f"token file {path} is open to group or others (mode {st.st_mode & 0o777:04o}): chmod 600 {path}")
    if not token:
        raise InvalidConfig(f"token file {path} is empty")
    return token


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def check_traceparent(tp: Optional[str]) -> Optional[str]:
    """tp if it is a W3C traceparent (version-traceid-spanid-flags, lowercase hex), else
    InvalidConfig: nothing else goes into a header."""
    if tp is None or tp == "":
        return None
    if not isinstance(tp, str) or not _TRACEPARENT.fullmatch(tp) or tp[3:35] == "0" * 32 or tp[36:52] == "0" * 16:
        raise InvalidConfig(f"traceparent {tp!r}: give a W3C traceparent, 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, "
                            "e.g. opentelemetry's propagate.inject({})['traceparent']")
    return tp


def endpoint(socket: Optional[str], address: Optional[str], token: Optional[str],
             token_file: Optional[str] = None, ca: Optional[str] = None,
             client_cert: Optional[str] = None, client_key: Optional[str] = None) -> Endpoint:
    """The endpoint for Roche's socket=, address=, token=, token_file=, ca=, client_cert=
    and client_key= arguments: the token given, else the one in token_file (or
    $ROCHE_TOKEN_FILE), else $ROCHE_TOKEN; for https://, the CA given, else
    $ROCHE_CA_FILE, else the system's, and the client certificate given, else
    $ROCHE_CLIENT_CERT and $ROCHE_CLIENT_KEY."""
    token_file = token_file or os.environ.get("ROCHE_TOKEN_FILE") or None
    if not token and token_file:
        token = read_token_file(token_file)
    token = token or os.environ.get("ROCHE_TOKEN") or None
    if not address:
        return Endpoint(socket=socket or default_socket(), token=token)
    u = urlsplit(address)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise InvalidConfig(f"daemon address {address!r}: use https://HOST:PORT (TLS) or http://HOST:PORT "
                            "(plaintext, loopback), e.g. https://127.0.0.1:7878")
    port = u.port or (443 if u.scheme == "https" else 80)
    if u.scheme == "http":
        if ca or client_cert or client_key:
            raise InvalidConfig(f"ca=, client_cert= and client_key= are for TLS: use https://{u.netloc}")
        return Endpoint(host=u.hostname, port=port, token=token)
    ctx = _tls.context(*_tls.settings(ca, client_cert, client_key))
    return Endpoint(host=u.hostname, port=port, tls=True, token=token, ssl_context=ctx)
