"""The SQL of the application's side of the queue: reading chains and jobs, and the
chain actions (cancel, workerless completion, retry, trigger, delete). Same calling
convention as :mod:`state_adapters.statements.queue`: a method per statement, returning a
:class:`~state_adapters.statements.queue.Query`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import Select, and_, bindparam, delete, exists, func, or_, select, type_coerce
from sqlalchemy import update as update_rows

from state_adapters.model import UNFINISHED_STATUSES
from state_adapters.schema import Tables, json_type
from state_adapters.statements.dialect import SqlDialect
from state_adapters.statements.queue import Query, job_columns
from state_adapters.statements.records import new_job_status

_JSON = json_type()


class ChainStatements:
    """Reads and chain actions on one table set, shaped by one dialect."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.job_columns = job_columns(tables)
        chains = tables.chains
        self.chain_columns = [
            chains.c.type_name.label("chain_type_name"),
            chains.c.created_at.label("chain_created_at"),
            chains.c.completed_at.label("chain_completed_at"),
        ]

    # -- chain actions -----------------------------------------------------------------

    def lock_chain(self, chain_id: str) -> Query:
        """The chain's row, locked for update (nothing when it does not exist)."""
        chains = self.tables.chains
        return Query(
            self.dialect.update_lock(select(chains.c.id).where(chains.c.id == chain_id)), {}
        )

    def lock_unfinished_jobs(self, chain_id: str) -> Query:
        """The chain's blocked, pending or running jobs, locked for update."""
        jobs = self.tables.jobs
        query = select(jobs.c.id, jobs.c.status, jobs.c.type_name).where(
            jobs.c.chain_id == chain_id, jobs.c.status.in_(UNFINISHED_STATUSES)
        )
        return Query(self.dialect.update_lock(query), {})

    def finish_jobs(
        self, job_ids: Sequence[str], status: str, now: datetime, output: Any = None
    ) -> Query:
        """Move unfinished jobs to a final status without a lease (cancel,
        workerless completion)."""
        jobs = self.tables.jobs
        values: dict[str, Any] = {"status": status, "completed_at": now, "leased_until": None}
        if status == "completed":
            values["output"] = type_coerce(output, _JSON)
        statement = (
            update_rows(jobs)
            .where(jobs.c.id.in_(list(job_ids)), jobs.c.status.in_(UNFINISHED_STATUSES))
            .values(**values)
        )
        return Query(statement, {})

    def trigger_pending(self, chain_id: str, now: datetime) -> Query:
        """Make the chain's pending job due ``now``; returns its type."""
        jobs = self.tables.jobs
        statement = (
            update_rows(jobs)
            .where(jobs.c.chain_id == chain_id, jobs.c.status == "pending")
            .values(scheduled_at=now)
            .returning(jobs.c.type_name)
        )
        return Query(statement, {})

    def last_job(self, chain_id: str) -> Query:
        """The chain's last job (locked): the one a retry runs again."""
        jobs = self.tables.jobs
        query = (
            select(jobs.c.id, jobs.c.status, jobs.c.type_name)
            .where(jobs.c.chain_id == chain_id)
            .order_by(jobs.c.chain_index.desc())
            .limit(1)
        )
        return Query(self.dialect.update_lock(query), {})

    def unfinished_blockers(self, job_id: str) -> Query:
        """The chains ``job_id`` waits on that are not final yet, share-locked so none
        becomes final (and releases its dependents) before this transaction commits."""
        blockers, chains = self.tables.blockers, self.tables.chains
        query = (
            select(chains.c.id)
            .join(blockers, blockers.c.blocker_chain_id == chains.c.id)
            .where(blockers.c.job_id == job_id, chains.c.completed_at.is_(None))
            .order_by(chains.c.id)
        )
        return Query(self.dialect.share_lock(query), {})

    def retry_job(self, job_id: str, blockers_pending: int, now: datetime) -> Query:
        """Put a failed or cancelled job back as new: attempts start over, due now (or
        blocked while ``blockers_pending`` chains it waits on are unfinished)."""
        jobs = self.tables.jobs
        statement = (
            update_rows(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_(("failed", "cancelled")))
            .values(
                status=new_job_status(blockers_pending),
                blockers_pending=blockers_pending,
                attempt=0,
                scheduled_at=now,
                completed_at=None,
                leased_by=None,
                leased_until=None,
                lease_token=None,
            )
        )
        return Query(statement, {})

    def reopen_chain(self, chain_id: str) -> Query:
        """Make a final chain unfinished again (its last job is being retried)."""
        chains = self.tables.chains
        return Query(
            update_rows(chains).where(chains.c.id == chain_id).values(completed_at=None), {}
        )

    def blocked_dependents_exist(self, chain_id: str) -> Query:
        """Whether jobs of other chains are blocked on this chain."""
        jobs, blockers = self.tables.jobs, self.tables.blockers
        statement = select(
            exists().where(
                blockers.c.blocker_chain_id == chain_id,
                blockers.c.job_id == jobs.c.id,
                jobs.c.status == "blocked",
                jobs.c.chain_id != chain_id,
            )
        )
        return Query(statement, {})

    def delete_chain(self, chain_id: str) -> list[Query]:
        """Delete a chain, its jobs' blocker links and log lines, its dedup key, its jobs
        and the chain row, in that order."""
        t = self.tables
        own_jobs = select(t.jobs.c.id).where(t.jobs.c.chain_id == chain_id).scalar_subquery()
        statements = [
            delete(t.job_logs).where(t.job_logs.c.job_id.in_(own_jobs)),
            delete(t.blockers).where(
                or_(t.blockers.c.job_id.in_(own_jobs), t.blockers.c.blocker_chain_id == chain_id)
            ),
            delete(t.dedup_keys).where(t.dedup_keys.c.chain_id == chain_id),
            delete(t.jobs).where(t.jobs.c.chain_id == chain_id),
            delete(t.chains).where(t.chains.c.id == chain_id),
        ]
        return [Query(statement, {}) for statement in statements]

    # -- reading -----------------------------------------------------------------------

    def get_chain(self, chain_id: str) -> Query:
        """The chain with its last job."""
        return Query(self._get_chain, {"chain_id": chain_id})

    @cached_property
    def _get_chain(self) -> Select[Any]:
        return self._chain_select().where(self.tables.chains.c.id == bindparam("chain_id"))

    def get_chains(self, chain_ids: Sequence[str]) -> Query:
        """The chains among these ids, with their last jobs."""
        return Query(self._get_chains, {"chain_ids": list(chain_ids)})

    @cached_property
    def _get_chains(self) -> Select[Any]:
        chains = self.tables.chains
        return self._chain_select().where(chains.c.id.in_(bindparam("chain_ids", expanding=True)))

    def get_job(self, job_id: str) -> Query:
        """One job."""
        return Query(self._get_job, {"job_id": job_id})

    @cached_property
    def _get_job(self) -> Select[Any]:
        return select(*self.job_columns).where(self.tables.jobs.c.id == bindparam("job_id"))

    def _chain_select(self) -> Select[Any]:
        """Chains joined with their last job (the highest ``chain_index``)."""
        chains, jobs = self.tables.chains, self.tables.jobs
        later = jobs.alias("later")
        last_index = (
            select(func.max(later.c.chain_index))
            .where(later.c.chain_id == chains.c.id)
            .scalar_subquery()
        )
        return select(*self.chain_columns, *self.job_columns).select_from(
            chains.join(
                jobs, and_(jobs.c.chain_id == chains.c.id, jobs.c.chain_index == last_index)
            )
        )

    def list_chains(
        self, status: str | None, type_name: str | None, limit: int, after: str | None
    ) -> Query:
        """Up to ``limit`` chains newest first, older than the id ``after``."""
        chains, jobs = self.tables.chains, self.tables.jobs
        query = self._chain_select()
        if status is not None:
            query = query.where(jobs.c.status == status)
        if type_name is not None:
            query = query.where(chains.c.type_name == type_name)
        if after is not None:
            query = query.where(chains.c.id < after)
        return Query(query.order_by(chains.c.id.desc()).limit(limit), {})

    def list_jobs(
        self,
        chain_id: str | None,
        status: str | None,
        type_name: str | None,
        limit: int,
        after: str | None,
    ) -> Query:
        """Up to ``limit`` jobs newest first (older than the id ``after``), or with
        ``chain_id`` that chain's jobs in chain order (after the index ``after``)."""
        jobs = self.tables.jobs
        query = select(*self.job_columns)
        if status is not None:
            query = query.where(jobs.c.status == status)
        if type_name is not None:
            query = query.where(jobs.c.type_name == type_name)
        if chain_id is not None:
            query = query.where(jobs.c.chain_id == chain_id)
            if after is not None:
                query = query.where(jobs.c.chain_index > int(after))
            return Query(query.order_by(jobs.c.chain_index).limit(limit), {})
        if after is not None:
            query = query.where(jobs.c.id < after)
        return Query(query.order_by(jobs.c.id.desc()).limit(limit), {})

    def count_jobs(self, type_names: Sequence[str] | None) -> Query:
        """The number of jobs per status (of these types)."""
        jobs = self.tables.jobs
        query = select(jobs.c.status, func.count()).group_by(jobs.c.status)
        if type_names is not None:
            query = query.where(jobs.c.type_name.in_(list(type_names)))
        return Query(query, {})
