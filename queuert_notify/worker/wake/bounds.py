"""How long a worker waits for its notify adapter. Every call it makes is bounded, so an
adapter that hangs (a blackholed Redis, a user's adapter stuck after ``connect()``)
costs latency only: the worker polls, claims and stops as without notifications."""

from __future__ import annotations

import asyncio

SUBSCRIBE_LIMIT = 5.0
"""Seconds the worker's job-scheduled subscription may take (then it polls and keeps
trying in the background)."""
CALL_LIMIT = 2.0
"""Seconds a call on the claim or run path may take (a wake hint, an acknowledgement,
listening for a job's ownership loss): long enough for a loaded server and for the
second that a lists-mode hint may wait for a token its own blocking move took; short
next to a poll interval."""


class CallGate:
    """One kind of call to the notify adapter, each bounded by ``limit`` seconds. After
    one failed or timed out, the next ``pause`` seconds skip the call (the caller uses
    its safe answer), so a hanging server costs one bounded wait per pause, not one per
    call."""

    def __init__(self, limit: float, pause: float) -> None:
        self.limit = limit
        self._pause = pause
        self._retry_at = float("-inf")

    @property
    def open(self) -> bool:
        """Whether the call is to be made now."""
        return asyncio.get_running_loop().time() >= self._retry_at

    def failed(self) -> None:
        self._retry_at = asyncio.get_running_loop().time() + self._pause
