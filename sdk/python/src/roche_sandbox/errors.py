"""Typed exceptions. Each carries Roche's own message, which says what to do."""

from __future__ import annotations

from typing import Optional


class RocheError(Exception):
    """Base of every error the SDK raises.

    ``reason`` names the core error behind it ("not_found", "invalid_config", ...) or is
    empty when Roche did not say. ``retry_after``, in seconds, is set on a refusal that
    passes (roched's pool with a full queue raises ResourceExhausted with it): how long
    to wait before asking again. It is None otherwise.
    """

    reason: str = ""
    retry_after: Optional[float] = None

    def __init__(self, message: str, reason: Optional[str] = None, retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        if retry_after is not None:
            self.retry_after = retry_after


class SandboxNotFound(RocheError):
    """No sandbox has that id: it was destroyed, its lifetime ended, or it never existed."""

    reason = "not_found"


class SandboxTimeout(RocheError, TimeoutError):
    """Roche did not answer in time (the daemon, the engine or the sandbox is stuck).

    A command that runs past its own ``timeout`` is not an error: its ExecResult says
    ``timed_out``.
    """

    reason = "timeout"


class ProviderUnavailable(RocheError):
    """The backend cannot be reached: no daemon and no CLI, Docker down, python.wasm missing."""

    reason = "unavailable"
    #: Set when the call's connection to roched was lost rather than answered: "refused"
    #: (nothing listened) or "broke" (cut midway); what the SDK's retries go by.
    lost = ""


class InvalidConfig(RocheError, ValueError):
    """The request is malformed or impossible (a bad memory size, an empty command, ...)."""

    reason = "invalid_config"


class Unsupported(InvalidConfig):
    """The provider cannot honour the request without weakening the sandbox."""

    reason = "unsupported"


class ImageNotFound(InvalidConfig):
    """The image is not present locally and could not be pulled."""

    reason = "image_not_found"


class ResourceExhausted(RocheError):
    """A limit was reached, e.g. the daemon's --max-sandboxes."""

    reason = "exhausted"


class PermissionDenied(RocheError, PermissionError):
    """The sandbox does not allow it (a read-only path, another user's file)."""

    reason = "permission_denied"


class InUse(RocheError):
    """Something still uses it: a workspace mounted by a live sandbox, or a snapshot a
    live sandbox was made from. Destroy those sandboxes first."""

    reason = "in_use"


class OutputGone(RocheError):
    """A command's output asked for fell out of its window: a command keeps the last
    bytes of each stream (16 MiB by default), and the oldest go. The message names the
    first offset still kept of each stream; ``commands.list()`` shows them too
    (``first_stdout``, ``first_stderr``). Connect again from there."""

    reason = "output_gone"


_BY_REASON: dict[str, type[RocheError]] = {
    cls.reason: cls
    for cls in (
        SandboxNotFound,
        SandboxTimeout,
        ProviderUnavailable,
        InvalidConfig,
        Unsupported,
        ImageNotFound,
        ResourceExhausted,
        PermissionDenied,
        InUse,
        OutputGone,
    )
}

# The core's sentinel texts (errors.go), which every message wrapping them contains.
# Longer phrases first: "image not found" also contains "not found".
_BY_TEXT: tuple[tuple[str, str], ...] = (
    ("image not found", "image_not_found"),
    ("invalid config", "invalid_config"),
    ("unsupported", "unsupported"),
    ("provider unavailable", "unavailable"),
    ("resource exhausted", "exhausted"),
    ("permission denied", "permission_denied"),
    ("in use", "in_use"),
    ("output no longer kept", "output_gone"),
    ("not found", "not_found"),
    ("timed out", "timeout"),
)


def reason_from_text(message: str) -> str:
    """The core error a message names: its leading sentinel, else any sentinel in it."""
    lower = message.lower()
    for text, reason in _BY_TEXT:
        if lower.startswith(text + ":"):
            return reason
    for text, reason in _BY_TEXT:
        if text + ":" in lower or lower.endswith(text):
            return reason
    return ""


def error_for(reason: str, message: str, retry_after: Optional[float] = None) -> RocheError:
    """The typed exception for a core error reason."""
    cls = _BY_REASON.get(reason, RocheError)
    return cls(message, reason or None, retry_after)
