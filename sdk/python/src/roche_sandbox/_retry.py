"""Retries of calls to roched that are safe to repeat, in both halves (the rules of the
Go client's client/retry.go): a read, a destroy, a create (the SDK gives every create
an idempotency key) and an exec given an idempotency key are repeated when the
connection to roched was lost (roched restarting, or a replica of a group dying behind
a Service that sends the next connection to another), with backoff and jitter, for at
most RETRY_FOR and never past the call's own deadline. An answer from roched, whatever
it says, is never retried; nor is a call that never reached a roched this client has
not reached before (a roched that was never there is not waited for)."""

from __future__ import annotations

import random
import time
from typing import Optional

from ._deadline import Deadline

#: The longest one call is retried for.
RETRY_FOR = 30.0
FIRST_DELAY = 0.1
MAX_DELAY = 2.0

#: The value of a ProviderUnavailable's ``lost`` attribute (set by _discovery): the call
#: never reached roched (nothing listened), or its connection broke midway.
REFUSED, BROKE = "refused", "broke"


def lost(e: BaseException) -> str:
    """How e lost its connection to roched: REFUSED, BROKE, or "" when it did not (an
    answer, a timeout, a TLS failure)."""
    return str(getattr(e, "lost", "") or "")


class Backoff:
    """The waits between the attempts of one call."""

    def __init__(self, d: Deadline) -> None:
        self._d = d
        self._until = time.monotonic() + RETRY_FOR
        self._delay = FIRST_DELAY

    def next(self, e: BaseException, reached: bool) -> Optional[float]:
        """How long to wait before trying again after e, or None to give up (raise e)."""
        kind = lost(e)
        if kind != BROKE and not (kind == REFUSED and reached):
            return None
        # Jitter: many clients cut off by one replica's loss do not all come back at once.
        wait = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(self._delay * 2, MAX_DELAY)
        left = self._d.remaining()
        if time.monotonic() + wait > self._until or (left is not None and wait >= left):
            return None
        return wait
