"""A worker's row in the worker registry (:mod:`state_adapters.steps.operations`): written
when it starts, refreshed on a timer at the reaper's pace (one write per tick, nothing
per job), deleted when it stops; and the warning about job types that no live worker
handles."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from state_adapters.model import known_types, unhandled_line, unhandled_types
from state_adapters.outage_log import OutageLog
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

MAX_HEARTBEAT_INTERVAL = 60.0
"""A worker beats at least this often (seconds), whatever its reap interval, so that
it never looks dead (:data:`~state_adapters.model.WORKER_DEAD_AFTER`)."""
UNHANDLED_CHECK_INTERVAL = 300.0
"""Seconds between a worker's reads of the types with due jobs and no live worker."""
UNHANDLED_WARNING_INTERVAL = 3600.0
"""A worker warns about one unhandled type at most once per this many seconds."""
_FORGET_LIMIT = 2.0
"""Seconds a stopping worker spends deleting its row (a dead row ages out anyway)."""


class Registration:
    """Keeps this worker's row in the registry while :meth:`run` runs."""

    def __init__(
        self,
        state: StateAdapter,
        type_names: Sequence[str],
        *,
        slots: int,
        interval: float,
        worker_id: str,
    ) -> None:
        self._state = state
        self._type_names = list(type_names)
        self._slots = slots
        self._interval = min(interval, MAX_HEARTBEAT_INTERVAL)
        self._worker_id = worker_id
        self._outage = OutageLog(logger, "recording this worker in the registry")
        self._checked_at = float("-inf")
        self._warned_at: dict[str, float] = {}

    async def run(self) -> None:
        """Beat until cancelled, then delete the row (bounded)."""
        starting = True
        try:
            while True:
                try:
                    await self._state.record_worker(
                        self._worker_id,
                        host=socket.gethostname(),
                        pid=os.getpid(),
                        type_names=self._type_names,
                        slots=self._slots,
                        starting=starting,
                    )
                    if time.monotonic() - self._checked_at >= UNHANDLED_CHECK_INTERVAL:
                        await self.warn_unhandled()
                except Exception:
                    self._outage.failed("retrying at the next tick", worker_id=self._worker_id)
                else:
                    starting = False
                    self._outage.succeeded()
                await asyncio.sleep(self._interval)
        finally:
            try:
                await asyncio.wait_for(self._state.forget_worker(self._worker_id), _FORGET_LIMIT)
            except Exception:
                logger.debug("could not delete this worker's registry row", exc_info=True)

    async def warn_unhandled(self) -> None:
        """One WARNING per type (at most one an hour) with due jobs and no live worker."""
        self._checked_at = now = time.monotonic()
        workers = await self._state.workers()
        instant = datetime.now(UTC)
        unhandled = unhandled_types(await self._state.due_jobs_by_type(), workers, instant)
        known = known_types(workers, instant)
        for type_name, count in unhandled.items():
            if now - self._warned_at.get(type_name, float("-inf")) < UNHANDLED_WARNING_INTERVAL:
                continue
            self._warned_at[type_name] = now
            logger.warning(
                unhandled_line(type_name, count, known),
                extra={"worker_id": self._worker_id, "type_name": type_name},
            )
