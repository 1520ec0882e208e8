"""Retention: deleting finished chains older than a cut-off, a bounded batch at a time.

What one batch guarantees (:func:`prune_chains`):

- only chains that are final (``completed_at`` set: completed, failed or
  cancelled) and finished before the cut-off are deleted, with their jobs, the
  blocker links of those jobs and of those chains, and their dedup keys;
- never a chain that a job of an unfinished chain waits or waited on: it stays
  until its dependents' chains are final too (so they can still be read, and
  retried, with their blockers in place);
- two pruners never delete the same chains and never wait on each other: the batch
  is picked with ``FOR UPDATE SKIP LOCKED`` on Postgres (SQLite runs one writer at
  a time), and each batch is a transaction of its own, holding its locks only for
  the few statements that delete it;
- a chain being started as a blocker of a new chain, reopened by ``retry_chain`` or
  deleted by ``delete_chain`` concurrently is either skipped (its row is locked) or
  gone before that writer reads it (it then sees ``ChainNotFoundError``).

A schedule's last tick lives in its own table (``{prefix}schedules``), not in the
dedup keys deleted here, so pruning the chain of a tick never makes that tick due
again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Delete, Select, and_, delete, exists, false, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE
from state_adapters.schema import Tables
from state_adapters.sql_dialect import SqlDialect

DEFAULT_BATCH_SIZE = DEFAULT_PRUNE_BATCH_SIZE


class PruningStatements:
    """The statements of one batch, for one table set on one dialect."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect

    def pick_chains(self, finished_before: datetime, batch_size: int) -> Select[Any]:
        """The oldest finished chains before the cut-off that no unfinished chain waits
        on, locked, skipping chains another transaction holds (Postgres)."""
        chains, jobs, blockers = self.tables.chains, self.tables.jobs, self.tables.blockers
        dependent = chains.alias("dependent")
        waited_on_by_unfinished = exists().where(
            blockers.c.blocker_chain_id == chains.c.id,
            jobs.c.id == blockers.c.job_id,
            dependent.c.id == jobs.c.chain_id,
            dependent.c.id != chains.c.id,
            dependent.c.completed_at.is_(None),
        )
        query = (
            select(
                chains.c.id,
                chains.c.has_dependents,
                chains.c.dedup_key,
                # Only a chain's first job, whose id is the chain's, is ever blocked.
                exists().where(blockers.c.job_id == chains.c.id).label("was_blocked"),
            )
            .where(
                chains.c.completed_at < finished_before,
                # has_dependents is set before any job waits on the chain: most
                # chains skip the lookup.
                or_(chains.c.has_dependents == false(), ~waited_on_by_unfinished),
            )
            .order_by(chains.c.completed_at)
            .limit(batch_size)
        )
        return self.dialect.skip_locked(query)

    def delete_jobs(self) -> Delete:
        """Delete the jobs of the chains bound as ``chain_ids``."""
        jobs = self.tables.jobs
        return delete(jobs).where(self.dialect.in_list(jobs.c.chain_id, "chain_ids"))

    def delete_blocker_links(self) -> Delete:
        """Delete the blocker links of the chains bound as ``chain_ids``, both ways: what
        their first jobs waited on, and who waited on them."""
        blockers = self.tables.blockers
        return delete(blockers).where(
            or_(
                self.dialect.in_list(blockers.c.job_id, "chain_ids"),
                self.dialect.in_list(blockers.c.blocker_chain_id, "chain_ids"),
            )
        )

    def delete_dedup_keys(self) -> Delete:
        """Delete the dedup keys the chains bound as ``chain_ids`` hold."""
        keys = self.tables.dedup_keys
        return delete(keys).where(self.dialect.in_list(keys.c.chain_id, "chain_ids"))

    def delete_chains(self) -> Delete:
        """Delete the (final) chain rows bound as ``chain_ids``."""
        chains = self.tables.chains
        return delete(chains).where(
            and_(self.dialect.in_list(chains.c.id, "chain_ids"), chains.c.completed_at.is_not(None))
        )


async def prune_chains(
    conn: AsyncConnection,
    statements: PruningStatements,
    finished_before: datetime,
    batch_size: int,
) -> int:
    """Delete one batch (at most ``batch_size`` chains) in the caller's transaction;
    returns how many chains were deleted."""
    picked = (await conn.execute(statements.pick_chains(finished_before, batch_size))).all()
    if not picked:
        return 0
    params = {"chain_ids": [row.id for row in picked]}
    await conn.execute(statements.delete_jobs(), params)
    # Most chains have neither links nor a dedup key, and the chain row says so: a batch
    # of them is three statements, so it holds its locks (on SQLite, the database) briefly.
    if any(row.was_blocked or row.has_dependents for row in picked):
        await conn.execute(statements.delete_blocker_links(), params)
    if any(row.dedup_key is not None for row in picked):
        await conn.execute(statements.delete_dedup_keys(), params)
    deleted: int = (await conn.execute(statements.delete_chains(), params)).rowcount
    return deleted
