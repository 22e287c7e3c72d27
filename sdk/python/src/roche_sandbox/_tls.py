"""TLS to roched at an https:// address: the context that verifies it (ca=, else
ROCHE_CA_FILE, else the system's CAs) with an optional client certificate, and one line
saying why a handshake failed."""

from __future__ import annotations

import os
import ssl
from typing import Optional

from .errors import InvalidConfig, ProviderUnavailable


class TLSFailure(ProviderUnavailable):
    """roched could not be reached safely: its certificate is not trusted or expired, or
    it refused this client's. Never a reason to fall back to running elsewhere."""


def context(ca: Optional[str], client_cert: Optional[str], client_key: Optional[str]) -> ssl.SSLContext:
    """A client context trusting ca (a PEM file; the system's CAs when None), presenting
    client_cert and client_key when given."""
    try:
        ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfig(f"CA file {ca}: {getattr(e, 'strerror', None) or e}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if bool(client_cert) != bool(client_key):
        raise InvalidConfig("a client certificate needs both client_cert= and client_key= (or ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY)")
    if client_cert:
        try:
            ctx.load_cert_chain(client_cert, client_key)
        except (OSError, ssl.SSLError) as e:
            raise InvalidConfig(f"client certificate {client_cert} and key {client_key}: {e}") from None
    return ctx


def settings(ca: Optional[str], client_cert: Optional[str], client_key: Optional[str]) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """The arguments, else ROCHE_CA_FILE, ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY."""
    return (ca or os.environ.get("ROCHE_CA_FILE") or None,
            client_cert or os.environ.get("ROCHE_CLIENT_CERT") or None,
            client_key or os.environ.get("ROCHE_CLIENT_KEY") or None)


# OpenSSL's verify results (x509_vfy.h) that mean "expired" or "not yet valid".
_EXPIRED, _NOT_YET_VALID = 10, 9


def problem(where: str, err: BaseException) -> Optional[TLSFailure]:
    """The one-line error for a TLS failure talking to roched at where, or None when err
    is not about TLS."""
    if isinstance(err, ssl.SSLCertVerificationError):
        code = getattr(err, "verify_code", None)
        if code == _EXPIRED:
            return TLSFailure(f"roched at {where} presented a certificate that expired: renew its --tls-cert "
                              "(roched reloads it without a restart)")
        if code == _NOT_YET_VALID:
            return TLSFailure(f"roched at {where} presented a certificate that is not valid yet (check this host's clock)")
        msg = getattr(err, "verify_message", None) or str(err)
        if "hostname" in msg or "IP address mismatch" in msg:
            return TLSFailure(f"roched at {where} presented a certificate for other names ({msg}): use an address it names")
        return TLSFailure(f"roched at {where} presented a certificate this client does not trust ({msg}): "
                          "give the CA that signed it with ca= or ROCHE_CA_FILE")
    if isinstance(err, ssl.SSLEOFError) or (isinstance(err, ConnectionResetError) and where.startswith("https://")):
        # TLS 1.3 ends the handshake before the server has checked the client's
        # certificate, so a refused one may show only as the connection closing.
        return TLSFailure(f"roched at {where} closed the TLS connection: if it requires a client certificate "
                          "(--client-ca), give client_cert= and client_key= (or ROCHE_CLIENT_CERT and "
                          "ROCHE_CLIENT_KEY) signed by that CA; else check that it is running")
    if isinstance(err, ssl.SSLError):
        reason = getattr(err, "reason", None) or ""
        if "ALERT" in reason and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason):
            return TLSFailure(f"roched at {where} refused this client's TLS handshake ({reason.lower()}): it requires a "
                              "client certificate signed by its --client-ca; give client_cert= and client_key= "
                              "(or ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY)")
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"):
            return TLSFailure(f"roched at {where} does not speak TLS: use an http:// address, or give roched --tls-cert and --tls-key")
        return TLSFailure(f"TLS with roched at {where} failed: {reason or err}")
    return None
