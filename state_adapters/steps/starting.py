"""Starting chains: the first jobs inserted (pending, or blocked on unfinished
chains), deduplication keys taken race-free, and a wake owed for every job that can
run now."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from state_adapters.errors import ChainNotFoundError
from state_adapters.ids import new_id
from state_adapters.model import NewChain, StartedChain
from state_adapters.notifications import NotificationBuffer
from state_adapters.statements.records import FirstJob

if TYPE_CHECKING:
    from state_adapters.database import Conn, Database

_DEDUP_ATTEMPTS = 20


async def start(
    db: Database, conn: Conn, notes: NotificationBuffer, chains: Sequence[NewChain], now: datetime
) -> list[StartedChain]:
    """Insert the chains (validated already)."""
    open_blockers: set[str] = set()
    if any(chain.blockers for chain in chains):
        open_blockers = await _mark_blockers(db, conn, chains)
    holders: dict[tuple[str, str], str] = {}
    ids = [chain.id or new_id() for chain in chains]
    if any(chain.dedup_key is not None for chain in chains):
        holders = await _take_dedup_keys(db, conn, chains, ids, now)
    started: list[StartedChain] = []
    firsts: list[FirstJob] = []
    blocker_rows: list[dict[str, str]] = []
    scheduled: dict[str, int] = {}
    for chain, chain_id in zip(chains, ids, strict=True):
        job = chain.job
        if chain.dedup_key is not None:
            holder = holders[(job.type_name, chain.dedup_key)]
            if holder != chain_id:
                started.append(StartedChain(holder, job.type_name, deduplicated=True))
                continue
        waiting_on = 0
        if chain.blockers:  # most chains have none: a batch skips the sets per chain
            waiting_on = sum(1 for b in set(chain.blockers) if b in open_blockers)
            blocker_rows.extend(
                {"job_id": chain_id, "blocker_chain_id": b} for b in dict.fromkeys(chain.blockers)
            )
        firsts.append(FirstJob(job, chain_id, chain.dedup_key, waiting_on))
        if waiting_on == 0:
            scheduled[job.type_name] = scheduled.get(job.type_name, 0) + 1
        started.append(StartedChain(chain_id, job.type_name, deduplicated=False))
    if firsts:
        await db.insert_first_jobs(conn, firsts, now)
    if blocker_rows:
        await conn.execute(*db.sql.insert_blockers(blocker_rows))
    for type_name, count in scheduled.items():
        notes.job_scheduled(type_name, count)
    return started


async def _mark_blockers(db: Database, conn: Conn, chains: Sequence[NewChain]) -> set[str]:
    """Flag every blocker chain as having dependents; the unfinished ones. Raises
    ``ChainNotFoundError`` (before any insert) for a blocker that does not exist."""
    blocker_ids = {b for chain in chains for b in chain.blockers}
    rows = (await conn.execute(*db.sql.mark_dependents(list(blocker_ids)))).all()
    missing = sorted(blocker_ids - {row.id for row in rows})
    if missing:
        raise ChainNotFoundError(
            f"blocker chain(s) {', '.join(missing)} do not exist; "
            "pass ids of chains that were started (and not deleted)"
        )
    # Flagging chains that exist is harmless if this start goes no further.
    return {row.id for row in rows if row.completed_at is None}


async def _take_dedup_keys(
    db: Database,
    conn: Conn,
    chains: Sequence[NewChain],
    ids: Sequence[str],
    now: datetime,
) -> dict[tuple[str, str], str]:
    """For every dedup key of the batch, the chain that answers it: an existing
    chain, or the first chain of this batch with that key (which then holds it).
    Keys are taken in sorted order, so two batches never wait on each other in
    a cycle."""
    first: dict[tuple[str, str], tuple[NewChain, str]] = {}
    for chain, chain_id in zip(chains, ids, strict=True):
        if chain.dedup_key is not None:
            first.setdefault((chain.job.type_name, chain.dedup_key), (chain, chain_id))
    holders: dict[tuple[str, str], str] = {}
    for key in sorted(first):
        chain, chain_id = first[key]
        existing = await _take_dedup_key(db, conn, chain, chain_id, now)
        holders[key] = chain_id if existing is None else existing
    return holders


async def _take_dedup_key(
    db: Database, conn: Conn, chain: NewChain, chain_id: str, now: datetime
) -> str | None:
    """Make ``chain_id`` the holder of the chain's dedup key, or return the id of
    the existing chain that deduplicates it."""
    type_name, key = chain.job.type_name, chain.dedup_key
    assert key is not None
    for _ in range(_DEDUP_ATTEMPTS):
        taken = await conn.execute(*db.sql.take_dedup_key(type_name, key, chain_id, now))
        if taken.first() is not None:
            return None
        # Someone holds the key. A statement of its own sees the holder even
        # when its transaction committed while our INSERT waited for it.
        holder = (await conn.execute(*db.sql.read_dedup_key(type_name, key))).first()
        if holder is None:
            continue  # the holder was deleted meanwhile: try to insert again
        if holder.existing_id is not None and _deduplicates(chain, holder, now):
            return str(holder.chain_id)
        moved = await conn.execute(
            *db.sql.move_dedup_key(type_name, key, holder.chain_id, chain_id, now)
        )
        if moved.first() is not None:
            return None
    raise RuntimeError(f"dedup key {key!r} kept changing hands; giving up")


def _deduplicates(chain: NewChain, holder: Any, now: datetime) -> bool:
    """Whether the chain holding the key answers this start instead of a new chain."""
    if chain.dedup_scope == "incomplete" and holder.completed_at is not None:
        return False
    if chain.dedup_window is not None:
        created: datetime = holder.created_at
        return created >= now - timedelta(seconds=chain.dedup_window)
    return True
