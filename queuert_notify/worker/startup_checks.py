"""What a worker checks once at start, before its loop claims anything."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from queuert_notify.errors import ConfigurationError
from queuert_notify.worker.settings import WorkerSettings
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

CLOCK_SKEW_WARNING = 1.0
"""Seconds this machine's clock may differ from the database's before a warning."""
_NO_SUCH_JOB = "0" * 32
"""A job id no job has (ids begin with their creation time)."""


async def check_tables(state: StateAdapter) -> None:
    """Raise the state adapter's ConfigurationError at start on a database whose queue
    tables were never migrated, instead of failing every claim of the loop.

    One primary-key read of the jobs table, for an id no job has; its JobNotFoundError
    means the table is there. Anything else (the database is down) is left to the loop,
    which retries it."""
    try:
        await state.get_job(_NO_SUCH_JOB)
    except ConfigurationError:
        raise
    except Exception:
        return


def check_pool_size(state: StateAdapter, settings: WorkerSettings) -> None:
    """Log how to size the engine's pool when, in atomic mode, it is too small for a
    session per handler."""
    size = state.connection_capacity()
    if settings.mode != "atomic" or size is None:
        return
    # A session per handler, the two connections claims and completions keep, and two
    # for the rest (reaping, renewals, failures).
    wanted = settings.concurrency + 4
    if size < wanted:
        # Connections beyond the pool are opened and closed per use, which costs more
        # than the job itself when every handler writes through ctx.session.
        logger.info(
            "the engine's pool (pool_size=%s) is smaller than concurrency + 4 = %s; "
            "handlers that use ctx.session will open a connection per job. "
            "Pass create_async_engine(..., pool_size=%s).",
            size,
            wanted,
            wanted,
            extra={"worker_id": settings.worker_id},
        )


async def check_clock(state: StateAdapter, *, worker_id: str) -> None:
    """Warn once when this machine's clock differs from the database's by more than
    :data:`CLOCK_SKEW_WARNING` seconds (plus half the round trip that read it).
    Schedules and lease expiry are judged on the database's clock, but the leases this
    worker sets and the due times it waits for are measured from its own. A database
    that does not answer is left to the loop."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    local = datetime.now(UTC)
    try:
        remote = await state.database_time()
    except Exception:
        return
    half_trip = (loop.time() - sent) / 2
    skew = (remote - local).total_seconds() - half_trip
    if abs(skew) > CLOCK_SKEW_WARNING + half_trip:
        logger.warning(
            "this machine's clock is %.1fs %s the database's; schedules and lease expiry "
            "follow the database's clock, but this worker's leases and due times follow "
            "its own: synchronise the clock (NTP)",
            abs(skew),
            "behind" if skew > 0 else "ahead of",
            extra={"worker_id": worker_id, "clock_skew": -skew},
        )
