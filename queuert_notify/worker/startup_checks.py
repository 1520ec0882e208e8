"""What a worker checks once at start, before its loop claims anything."""

from __future__ import annotations

import logging

from queuert_notify.errors import ConfigurationError
from queuert_notify.worker.settings import WorkerSettings
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

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
