"""The time limit of one call, shared by every layer that waits on Roche."""

from __future__ import annotations

import time
from typing import Optional

from .errors import SandboxTimeout


class Deadline:
    """An absolute time limit for one call; None is no limit."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> Optional[float]:
        if self.at is None:
            return None
        return self.at - time.monotonic()

    def expired(self, what: str) -> SandboxTimeout:
        return SandboxTimeout(
            f"timed out: {what} did not answer within {self.seconds:g} s; the call was abandoned "
            "(raise request_timeout= if the work is slow, or check that the sandbox is not paused)"
        )


class IdleDeadline(Deadline):
    """A time limit on each wait of a call that may rightly last long (a file streamed,
    a directory watched): it fails only when Roche sends or takes nothing for that long."""

    def remaining(self) -> Optional[float]:
        return self.seconds

    def expired(self, what: str) -> SandboxTimeout:
        return SandboxTimeout(
            f"timed out: {what} moved nothing for {self.seconds:g} s; the call was abandoned "
            "(raise request_timeout= if the sandbox is that slow, or check that it is not paused)"
        )
