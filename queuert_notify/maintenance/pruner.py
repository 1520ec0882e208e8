"""Retention: deleting finished chains older than the window, on a timer of its own."""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import timedelta

from queuert_notify.client.client import Client
from queuert_notify.errors import ConfigurationError, InvalidInputError
from state_adapters.outage_log import OutageLog

logger = logging.getLogger(__name__)

MIN_INTERVAL = 1.0
MAX_INTERVAL = 60.0


def check_retention(retention: object) -> timedelta | None:
    """``retention`` if it is ``None`` or a positive ``timedelta``."""
    if retention is None:
        return None
    if not isinstance(retention, timedelta) or retention <= timedelta(0):
        raise InvalidInputError(
            f"retention must be None or a positive timedelta (e.g. timedelta(days=7)), got "
            f"{retention!r}"
        )
    return retention


def prune_interval(retention: timedelta) -> float:
    """Seconds between prunes: a tenth of the window, from 1 s to 60 s. A finished chain
    is deleted at most that long after it left the window."""
    return min(max(retention.total_seconds() / 10, MIN_INTERVAL), MAX_INTERVAL)


class Pruner:
    """Every :func:`prune_interval` (± ``jitter``), deletes finished chains older than
    ``retention`` with :meth:`Client.prune` (bounded batches, paced). Leaderless:
    every worker with a retention prunes, and concurrent pruners never pick the same
    chains nor wait on each other, so whichever gets there first does the work and
    the others find little or nothing."""

    def __init__(
        self,
        client: Client,
        retention: timedelta,
        *,
        jitter: float,
        worker_id: str,
    ) -> None:
        self._client = client
        self._retention = retention
        self._interval = prune_interval(retention)
        self._jitter = jitter
        self._worker_id = worker_id
        self._outage = OutageLog(logger, "pruning finished chains")

    async def run(self) -> None:
        """Prune until cancelled."""
        while True:
            # Sleep first: a worker starting is busy enough.
            jitter = random.uniform(1 - self._jitter, 1 + self._jitter)
            await asyncio.sleep(self._interval * jitter)
            try:
                deleted = await self._client.prune(older_than=self._retention)
            except ConfigurationError:
                continue  # the worker's loop stops the worker with this error
            except Exception:
                self._outage.failed("retrying at the next interval", worker_id=self._worker_id)
                continue
            self._outage.succeeded()
            if deleted:
                logger.info(
                    "pruned finished chains",
                    extra={"worker_id": self._worker_id, "chains": deleted},
                )
