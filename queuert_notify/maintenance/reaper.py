"""Returning expired leases of a worker's types to pending, on a timer of its own."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from queuert_notify.client.client import Client
from queuert_notify.errors import ConfigurationError
from state_adapters.notifications import NotificationBuffer
from state_adapters.outage_log import OutageLog

logger = logging.getLogger(__name__)


class Reaper:
    """Every ``interval`` (± ``jitter``), returns expired leases of ``type_names`` to
    pending, whatever the backlog: a dead worker's jobs run again within its lease plus
    one interval. Leaderless: each reap is one atomic statement, so two workers never
    both return one job. ``reaped(job_id)`` is called for each, then ``woke()`` once
    (the loop should claim again)."""

    def __init__(
        self,
        client: Client,
        type_names: Sequence[str],
        *,
        interval: float,
        jitter: float,
        reaped: Callable[[str], None],
        woke: Callable[[], None],
        worker_id: str,
    ) -> None:
        self._client = client
        self._type_names = type_names
        self._interval = interval
        self._jitter = jitter
        self._reaped = reaped
        self._woke = woke
        self._worker_id = worker_id
        self._outage = OutageLog(logger, "reaping expired leases")

    async def run(self) -> None:
        """Reap until cancelled."""
        while True:
            try:
                reaped = await self._reap()
            except ConfigurationError:
                reaped = []  # the worker's loop stops the worker with this error
            except Exception:
                self._outage.failed("retrying at the next interval", worker_id=self._worker_id)
                reaped = []
            else:
                self._outage.succeeded()
            for job_id in reaped:
                logger.info(
                    "reaped an expired lease",
                    extra={"worker_id": self._worker_id, "job_id": job_id},
                )
                self._reaped(job_id)
            if reaped:
                self._woke()
            jitter = random.uniform(1 - self._jitter, 1 + self._jitter)
            await asyncio.sleep(self._interval * jitter)

    async def _reap(self) -> list[str]:
        notes = NotificationBuffer()
        reaped = await self._client.state.reap_expired_leases(self._type_names, notes=notes)
        await self._client.flush(notes)
        return reaped
