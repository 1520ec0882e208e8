"""Backoff: retry delays of a failed job attempt (exponential in the attempt number,
capped), and the pauses of reconnect loops (:class:`Backoff`)."""

from __future__ import annotations

import asyncio
import random

DEFAULT_BACKOFF_BASE = 1.0
"""Seconds before the retry of a first failed attempt."""
DEFAULT_BACKOFF_CAP = 3600.0
"""No retry waits longer than this (seconds)."""
DEFAULT_MAX_ATTEMPTS = 20
"""Attempts a job gets unless its chain says otherwise: with the default backoff
(1 s doubling to a cap of an hour) the last retry runs about nine hours after the first
failure. ``max_attempts=None`` retries forever."""
JITTER = 0.1
"""Each delay is spread by up to ±10 % so retries of a burst do not align."""


def retry_delays(base: float, cap: float) -> list[float]:
    """Delays (seconds) for attempts 1, 2, ... until the cap; the last applies to
    every later attempt. Delay n is ``min(cap, base * 2 ** (n - 1))`` ± jitter."""
    delays: list[float] = []
    delay = base
    while True:
        capped = min(delay, cap)
        delays.append(capped * random.uniform(1 - JITTER, 1 + JITTER))
        if capped >= cap or len(delays) >= 64:
            return delays
        delay *= 2


class Backoff:
    """Pauses for a reconnect or retry loop: doubling from ``first`` up to ``maximum``,
    each drawn from the upper half of its step so that many clients that lost the same
    server do not all come back at the same instant.

    Invariant: without :meth:`reset`, the step of each pause is at least the previous
    one's and never exceeds ``maximum``. Every reconnect loop of the project uses this
    one helper (notify subscribers, the worker's re-subscription and error backoff, the
    state layer's connection-loss retries).
    """

    __slots__ = ("_first", "_maximum", "_step")

    def __init__(self, first: float, maximum: float) -> None:
        if not 0 < first <= maximum:
            raise ValueError(f"backoff needs 0 < first <= maximum, got {first!r}, {maximum!r}")
        self._first = first
        self._maximum = maximum
        self._step = first

    @property
    def step(self) -> float:
        """The upper bound of the next pause (seconds)."""
        return self._step

    def next(self) -> float:
        """The next pause in seconds; the step after it doubles, capped at ``maximum``."""
        pause = self._step * random.uniform(0.5, 1.0)
        self._step = min(self._step * 2, self._maximum)
        return pause

    async def sleep(self) -> None:
        """Sleep for :meth:`next` seconds."""
        await asyncio.sleep(self.next())

    def reset(self) -> None:
        """Start from ``first`` again (call it after a success)."""
        self._step = self._first
