"""Retention: deleting finished chains older than a cut-off, a bounded batch at a time.

What one batch guarantees (:func:`prune_chains` statement by statement on SQLite,
:meth:`PruningStatements.prune_at_once` in one statement on Postgres):

- only chains that are final (``completed_at`` set: completed, failed or
  cancelled) and finished before the cut-off are deleted, with their jobs, the
  lines those jobs logged, the blocker links of those jobs and of those chains, and
  their dedup keys;
- never a chain that a job of an unfinished chain waits or waited on: it stays
  until its dependents' chains are final too (so they can still be read, and
  retried, with their blockers in place);
- two pruners never delete the same chains and never wait on each other: the batch
  is picked with ``FOR UPDATE SKIP LOCKED`` on Postgres (SQLite runs one writer at
  a time), and each batch is a transaction of its own, holding its locks only for
  the statements that delete it;
- a chain being started as a blocker of a new chain, reopened by ``retry_chain`` or
  deleted by ``delete_chain`` concurrently is either skipped (its row is locked) or
  gone before that writer reads it (it then sees ``ChainNotFoundError``).

A schedule's last tick lives in its own table (``{prefix}schedules``), not in the
dedup keys deleted here, so pruning the chain of a tick never makes that tick due
again.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import Delete, Integer, Select, and_, bindparam, delete, exists, false, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE
from state_adapters.schema import Tables, UtcDateTime
from state_adapters.statements.dialect import SqlDialect
from state_adapters.statements.queue import Query

DEFAULT_BATCH_SIZE = DEFAULT_PRUNE_BATCH_SIZE


class PruningStatements:
    """The statements of one batch, for one table set on one dialect; each is built
    once, with its values bound (same calling convention as
    :mod:`state_adapters.statements.queue`)."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect

    def pick_chains(self, finished_before: datetime, batch_size: int) -> Query:
        """The oldest finished chains before the cut-off that no unfinished chain waits
        on, locked, skipping chains another transaction holds (Postgres)."""
        return Query(self._pick_chains, {"before": finished_before, "n": batch_size})

    @cached_property
    def _pick_chains(self) -> Select[Any]:
        blockers = self.tables.blockers
        chains = self.tables.chains
        return self._picking(
            chains.c.id,
            chains.c.has_dependents,
            chains.c.dedup_key,
            # Only a chain's first job, whose id is the chain's, is ever blocked.
            exists().where(blockers.c.job_id == chains.c.id).label("was_blocked"),
        )

    def _picking(self, *columns: Any) -> Select[Any]:
        """``columns`` of the chains one batch takes, locked (see :meth:`pick_chains`)."""
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
            select(*columns)
            .where(
                chains.c.completed_at < bindparam("before", type_=UtcDateTime()),
                # has_dependents is set before any job waits on the chain: most
                # chains skip the lookup.
                or_(chains.c.has_dependents == false(), ~waited_on_by_unfinished),
            )
            .order_by(chains.c.completed_at)
            .limit(bindparam("n", type_=Integer()))
        )
        return self.dialect.skip_locked(query)

    def prune_at_once(self, finished_before: datetime, batch_size: int) -> Query:
        """One batch as ONE statement (Postgres: data-modifying CTEs): pick and lock the
        chains as :meth:`pick_chains`, delete their jobs, blocker links both ways and
        dedup keys, then the chains; its row count is the chains deleted. One round
        trip instead of one per statement, so a batch's fixed cost is small and
        batches can be small too (:mod:`queuert_notify.maintenance.prune_pacing`)."""
        return Query(self._prune_at_once, {"before": finished_before, "n": batch_size})

    @cached_property
    def _prune_at_once(self) -> Delete:
        t = self.tables
        picked = self._picking(t.chains.c.id).cte("picked")
        ids = select(picked.c.id)
        # Every part sees the snapshot before any deletes: the jobs are still there.
        logged = select(t.jobs.c.id).where(t.jobs.c.chain_id.in_(ids))
        parts = [
            delete(t.job_logs).where(t.job_logs.c.job_id.in_(logged)).cte("gone_lines"),
            delete(t.jobs).where(t.jobs.c.chain_id.in_(ids)).cte("gone_jobs"),
            delete(t.blockers).where(t.blockers.c.job_id.in_(ids)).cte("gone_waits"),
            delete(t.blockers).where(t.blockers.c.blocker_chain_id.in_(ids)).cte("gone_links"),
            delete(t.dedup_keys).where(t.dedup_keys.c.chain_id.in_(ids)).cte("gone_keys"),
        ]
        return (
            delete(t.chains)
            .where(t.chains.c.id.in_(ids), t.chains.c.completed_at.is_not(None))
            .add_cte(*parts)
        )

    def delete_job_logs(self, chain_ids: list[str]) -> Query:
        """Delete the lines the jobs of these chains logged (before the jobs)."""
        return Query(self._delete_job_logs, {"chain_ids": chain_ids})

    @cached_property
    def _delete_job_logs(self) -> Delete:
        jobs, lines = self.tables.jobs, self.tables.job_logs
        logged = select(jobs.c.id).where(self.dialect.in_list(jobs.c.chain_id, "chain_ids"))
        return delete(lines).where(lines.c.job_id.in_(logged))

    def delete_jobs(self, chain_ids: list[str]) -> Query:
        """Delete the jobs of these chains."""
        return Query(self._delete_jobs, {"chain_ids": chain_ids})

    @cached_property
    def _delete_jobs(self) -> Delete:
        jobs = self.tables.jobs
        return delete(jobs).where(self.dialect.in_list(jobs.c.chain_id, "chain_ids"))

    def delete_blocker_links(self, chain_ids: list[str]) -> Query:
        """Delete the blocker links of these chains, both ways: what their first jobs
        waited on, and who waited on them."""
        return Query(self._delete_blocker_links, {"chain_ids": chain_ids})

    @cached_property
    def _delete_blocker_links(self) -> Delete:
        blockers = self.tables.blockers
        return delete(blockers).where(
            or_(
                self.dialect.in_list(blockers.c.job_id, "chain_ids"),
                self.dialect.in_list(blockers.c.blocker_chain_id, "chain_ids"),
            )
        )

    def delete_dedup_keys(self, chain_ids: list[str]) -> Query:
        """Delete the dedup keys these chains hold."""
        return Query(self._delete_dedup_keys, {"chain_ids": chain_ids})

    @cached_property
    def _delete_dedup_keys(self) -> Delete:
        keys = self.tables.dedup_keys
        return delete(keys).where(self.dialect.in_list(keys.c.chain_id, "chain_ids"))

    def delete_chains(self, chain_ids: list[str]) -> Query:
        """Delete these (final) chain rows."""
        return Query(self._delete_chains, {"chain_ids": chain_ids})

    @cached_property
    def _delete_chains(self) -> Delete:
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
    picked = (await conn.execute(*statements.pick_chains(finished_before, batch_size))).all()
    if not picked:
        return 0
    chain_ids = [row.id for row in picked]
    await conn.execute(*statements.delete_job_logs(chain_ids))
    await conn.execute(*statements.delete_jobs(chain_ids))
    # Most chains have neither links nor a dedup key, and the chain row says so: a batch
    # of them is four statements, so it holds its locks (on SQLite, the database) briefly.
    if any(row.was_blocked or row.has_dependents for row in picked):
        await conn.execute(*statements.delete_blocker_links(chain_ids))
    if any(row.dedup_key is not None for row in picked):
        await conn.execute(*statements.delete_dedup_keys(chain_ids))
    deleted: int = (await conn.execute(*statements.delete_chains(chain_ids))).rowcount
    return deleted
