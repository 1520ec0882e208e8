"""Chains becoming final: marked once, announced, and the jobs that waited on them
released — after a completion, a failure for good, a reaped job's last attempt, a
cancel or a workerless completion alike."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from state_adapters.notifications import NotificationBuffer

if TYPE_CHECKING:
    from state_adapters.database import Conn, Database


async def finalize_chains(
    db: Database, conn: Conn, notes: NotificationBuffer, chain_ids: Sequence[str], now: datetime
) -> None:
    """Mark chains final (once), announce them and unblock what waited on them."""
    await after_finalizing(db, conn, notes, await finalize(db, conn, chain_ids, now))


async def finalize(
    db: Database, conn: Conn, chain_ids: Sequence[str], now: datetime
) -> list[tuple[str, bool]]:
    """Mark chains final (once); (chain id, has dependents) of those that were not."""
    if not chain_ids:
        return []
    rows = await conn.execute(*db.sql.finalize_chains(chain_ids, now))
    return [(row.id, bool(row.has_dependents)) for row in rows]


async def after_finalizing(
    db: Database, conn: Conn, notes: NotificationBuffer, finalized: Sequence[tuple[str, bool]]
) -> None:
    """Announce newly final chains and release the jobs that waited on them.

    Runs as a statement of its own after the chains were made final, so it
    sees every blocked job committed while their rows were being locked.
    """
    for chain_id, _ in finalized:
        notes.chain_completed(chain_id)
    waited_on = [chain_id for chain_id, has_dependents in finalized if has_dependents]
    if not waited_on:
        return
    for row in await conn.execute(*db.sql.unblock_dependents(waited_on)):
        if row.status == "pending":
            notes.job_scheduled(row.type_name)
