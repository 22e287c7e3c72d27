"""Which way to Roche a Roche (or AsyncRoche) takes: its transport settings and the
errors when neither roched nor the CLI will do. No I/O here; both halves share it."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from . import _discovery
from .errors import InvalidConfig, ProviderUnavailable, RocheError
from .types import SandboxInfo

#: How long the SDK waits for roched's /healthz before working through the CLI, as the CLI does.
PROBE_TIMEOUT = 2.0
TRANSPORTS = ("auto", "daemon", "cli")


def remaining_life(info: SandboxInfo) -> Optional[float]:
    """Seconds until the sandbox's lifetime ends, when known."""
    if info.expires_at is None:
        return None
    return max(0.0, (info.expires_at - datetime.now(timezone.utc)).total_seconds())


class Choice:
    """The transport settings shared by Roche and AsyncRoche, and how they resolve."""

    def __init__(self, provider: str, transport: str, socket: Optional[str], address: Optional[str],
                 token: Optional[str], cli: Optional[str], request_timeout: float,
                 token_file: Optional[str] = None, ca: Optional[str] = None,
                 client_cert: Optional[str] = None, client_key: Optional[str] = None,
                 traceparent: Optional[str] = None) -> None:
        if transport not in TRANSPORTS:
            raise InvalidConfig(f"transport {transport!r}: choose one of {', '.join(TRANSPORTS)}")
        if request_timeout <= 0:
            raise InvalidConfig(f"request_timeout {request_timeout!r}: give seconds > 0")
        self.provider = provider
        self.transport = transport
        self.endpoint = _discovery.endpoint(socket, address, token, token_file, ca, client_cert, client_key)
        tp = _discovery.check_traceparent(traceparent)
        if tp:
            self.endpoint = dataclasses.replace(self.endpoint, traceparent=tp)
        self.cli = cli
        self.request_timeout = float(request_timeout)

    def serves(self, health: Mapping[str, object]) -> bool:
        providers = health.get("providers")
        return isinstance(providers, list) and self.provider in providers

    def not_served(self, health: Mapping[str, Any]) -> ProviderUnavailable:
        """Why a roched that answered will not do."""
        return ProviderUnavailable(
            f"roched on {self.endpoint.where} does not serve the {self.provider} provider "
            f"(it serves {', '.join(map(str, health.get('providers') or [])) or 'none'})")

    def no_daemon(self, why: Optional[RocheError]) -> RocheError:
        if why is None or isinstance(why, ProviderUnavailable):
            return why or ProviderUnavailable(f"roched is not answering on {self.endpoint.where}")
        return ProviderUnavailable(why.message)

    def no_cli(self, why: str) -> ProviderUnavailable:
        return ProviderUnavailable(
            f"provider unavailable: {why}, and no roche CLI was found (none in this package, none on PATH): "
            "install a roche-sandbox wheel, which carries it, or set ROCHE_CLI to its path (bin/roche after make build)"
        )


def no_context() -> str:
    raise InvalidConfig("no context given: pass a Context from create_code_context or list_code_contexts, or its id")
