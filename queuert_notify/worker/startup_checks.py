"""What a worker checks once at start, before its loop claims anything."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from queuert_notify.errors import ConfigurationError, JobNotFoundError
from queuert_notify.worker.settings import WorkerSettings
from state_adapters.backoff import Backoff
from state_adapters.errors import cannot_connect, cannot_connect_reason
from state_adapters.protocol import StateAdapter
from state_adapters.transactions.connection_loss import is_connection_loss, is_refused

logger = logging.getLogger(__name__)

CLOCK_SKEW_WARNING = 1.0
"""Seconds this machine's clock may differ from the database's before a warning."""
_NO_SUCH_JOB = "0" * 32
"""A job id no job has (ids begin with their creation time)."""
_FIRST_PAUSE, _MAX_PAUSE = 1.0, 5.0
"""Seconds between tries of an unreachable database at start (doubling)."""


async def check_at_start(state: StateAdapter, settings: WorkerSettings) -> None:
    """Every check of a worker's start, in order: the pool's size (a hint), the
    database (waited for up to ``settings.startup_timeout``), the clocks (a warning)."""
    check_pool_size(state, settings)
    await wait_for_database(state, settings.startup_timeout, worker_id=settings.worker_id)
    await check_clock(state, worker_id=settings.worker_id)


async def wait_for_database(state: StateAdapter, patience: float, *, worker_id: str) -> None:
    """Return once the database answers and holds the queue's tables; raise a one-line
    ``ConfigurationError`` naming the database (password masked) when it is still
    unreachable after ``patience`` seconds, and at once for tables never migrated or a
    server that refuses the connection (wrong credentials, no such database).

    Each try is one primary-key read of the jobs table, for an id no job has (its
    ``JobNotFoundError`` means the table is there); each failed try logs one WARNING
    line, without a traceback."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    backoff = Backoff(_FIRST_PAUSE, _MAX_PAUSE)
    attempt = 0
    while True:
        attempt += 1
        try:
            await state.get_job(_NO_SUCH_JOB)
        except JobNotFoundError:
            return
        except Exception as exc:  # the state layer judges it (drivers raise their own)
            if is_refused(exc):
                raise _cannot_connect(state, exc) from None
            if not is_connection_loss(exc):
                raise
            left = deadline - loop.time()
            if left <= 0:
                reason = _cannot_connect(state, exc)
                raise ConfigurationError(
                    f"gave up after {patience:g}s (--startup-timeout): {reason}"
                ) from None
            pause = min(backoff.next(), left)
            logger.warning(
                "database unreachable at start (attempt %d; giving up in %.0fs): %s",
                attempt,
                left,
                cannot_connect_reason(exc, None),
                extra={"worker_id": worker_id, "attempt": attempt},
            )
            await asyncio.sleep(pause)


def _cannot_connect(state: StateAdapter, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        cannot_connect(state.address, cannot_connect_reason(exc, None), sqlite=False)
    )


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
