"""Detects a blocked event loop by measuring how late a task's own sleeps wake up.

A sleep of ``interval`` seconds that wakes ``lag`` seconds late means the loop ran
nothing else for at least ``lag`` seconds: something did blocking work on it (a
``time.sleep``, a synchronous driver or CPU-bound code inside an ``async def``).
While the loop is blocked nothing else runs — no lease renewal, no wakeup, no other
handler — so the lag is worth a warning long before leases are at risk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from contextlib import suppress

logger = logging.getLogger(__name__)


class LoopWatchdog:
    """Reports every wakeup that comes more than ``threshold`` seconds late.

    ``on_lag(lag, active)`` is called on the loop with the lateness in seconds and the
    union of ``active()`` taken before and after the late sleep (for a worker: the jobs
    that were running while the loop was blocked). Between :meth:`start` and
    :meth:`close` the watchdog owns exactly one task; after ``close()`` it owns none.
    """

    def __init__(
        self,
        threshold: float,
        *,
        on_lag: Callable[[float, frozenset[str]], object],
        active: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.threshold = threshold
        # Sleeping half the threshold bounds how long a block can go unmeasured.
        self.interval = threshold / 2
        self._on_lag = on_lag
        self._active = active
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="queuert-loop-watchdog")

    async def close(self) -> None:
        """Stop watching and wait for the task to end (idempotent)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = frozenset(self._active())
            slept_at = loop.time()
            await asyncio.sleep(self.interval)
            lag = loop.time() - slept_at - self.interval
            if lag > self.threshold:
                try:
                    self._on_lag(lag, before | frozenset(self._active()))
                except Exception:
                    logger.exception("loop lag callback failed")


def warn_blocked(lag: float, job_ids: Iterable[str], *, worker_id: str) -> tuple[str, ...]:
    """Log that the loop was blocked ``lag`` seconds while these jobs ran, with the
    usual cause and its fix; returns the job ids, sorted."""
    running = tuple(sorted(job_ids))
    logger.warning(
        "event loop blocked for %.2fs while jobs %s were running; a handler is probably "
        "doing blocking work in an async def (make it a plain def, which runs in a "
        "thread, or wrap the blocking call in asyncio.to_thread)",
        lag,
        ", ".join(running) or "(none)",
        extra={"worker_id": worker_id, "job_ids": list(running), "lag": lag},
    )
    return running
