"""Retry delays after a failed attempt: exponential in the attempt number, capped."""

from __future__ import annotations

import random

DEFAULT_BACKOFF_BASE = 1.0
"""Seconds before the retry of a first failed attempt."""
DEFAULT_BACKOFF_CAP = 3600.0
"""No retry waits longer than this (seconds)."""
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
