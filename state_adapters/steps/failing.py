"""Attempts that did not complete: a handler's failure written under its lease, and
leases that expired reaped — back to pending, or failed for good when the attempts
are used up (the chain then fails and releases what waited on it)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from state_adapters.model import FailureOutcome
from state_adapters.notifications import NotificationBuffer
from state_adapters.steps.completion import ownership_lost
from state_adapters.steps.finishing import finalize_chains

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from state_adapters.database import Database

logger = logging.getLogger(__name__)


async def fail(
    db: Database,
    conn: AsyncConnection,
    notes: NotificationBuffer,
    job_id: str,
    lease_token: str,
    error: str,
    delays: Sequence[float],
    *,
    final: bool,
    now: datetime,
) -> FailureOutcome:
    """Record a failed attempt, fenced by the token: pending again after
    ``delays[attempt - 1]`` seconds, or failed for good."""
    query = db.sql.fail_leased(job_id, lease_token, error, delays=delays, now=now, final=final)
    row = (await conn.execute(*query)).first()
    if row is None:
        raise ownership_lost(job_id)
    if row.status == "failed":
        await finalize_chains(db, conn, notes, [row.chain_id], now)
        return FailureOutcome("failed", None)
    notes.job_scheduled(row.type_name)
    return FailureOutcome("pending", row.scheduled_at)


async def reap(
    db: Database,
    conn: AsyncConnection,
    notes: NotificationBuffer,
    type_names: Sequence[str] | None,
    limit: int,
    now: datetime,
) -> list[str]:
    """Take back up to ``limit`` expired leases (of these types); the reaped job ids.
    Their workers lose ownership; a job with attempts left is owed a wake."""
    rows = (await conn.execute(*db.sql.reap_expired(type_names, limit, now))).all()
    for row in rows:
        notes.ownership_lost(row.id)
        if row.status != "failed":
            notes.job_scheduled(row.type_name)
    failed = [row.chain_id for row in rows if row.status == "failed"]
    await finalize_chains(db, conn, notes, failed, now)
    if rows:
        logger.info(
            "reaped expired leases",
            extra={"job_ids": [row.id for row in rows], "count": len(rows)},
        )
    return [row.id for row in rows]
