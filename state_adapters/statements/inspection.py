"""The SQL of the reads that show the queue to people (:mod:`state_adapters.steps.inspection`).
Same calling convention as :mod:`state_adapters.statements.queue`: a method per statement,
returning a :class:`~state_adapters.statements.queue.Query`.

Each statement is bounded by what it shows, never by the size of the jobs table:

- the overview counts unfinished jobs through ``jobs_status_ix`` (status, type) and the
  jobs finished since a moment through ``jobs_finished_ix`` (completed_at, type,
  status), the most recent ``finished_limit`` at most;
- a page of chains walks the chains' primary key (or ``chains_type_ix``) backwards or,
  filtered by blocked, failed or cancelled, ``jobs_status_chain_ix`` (status, chain_id)
  backwards, and stops after ``limit`` rows; filtered by pending or running, it sorts
  the jobs of that status (found through ``jobs_status_ix``);
- a search is three index lookups (chain id, job id, ``chains_dedup_ix``).
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, or_, select
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.model import UNFINISHED_STATUSES
from state_adapters.schema import SETTLED_ASIDE, SETTLED_ASIDE_STATUSES, Tables
from state_adapters.statements.dialect import SqlDialect
from state_adapters.statements.queue import Query, job_columns


class InspectionStatements:
    """The inspection reads on one table set, shaped by one dialect."""

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

    def unfinished_counts(self) -> Query:
        """Blocked, pending and running jobs counted by type and status."""
        return Query(self._unfinished_counts, {})

    @cached_property
    def _unfinished_counts(self) -> Select[Any]:
        jobs = self.tables.jobs
        return (
            select(jobs.c.type_name, jobs.c.status, func.count())
            .where(jobs.c.status.in_(UNFINISHED_STATUSES))
            .group_by(jobs.c.type_name, jobs.c.status)
        )

    def finished_per_minute(self, since: datetime, limit: int) -> Query:
        """Jobs finished since ``since`` (the most recent ``limit``) counted by minute,
        type and status: one pass over ``jobs_finished_ix``."""
        return Query(self._finished_per_minute, {"since": since, "finished_limit": limit})

    @cached_property
    def _finished_per_minute(self) -> Select[Any]:
        jobs = self.tables.jobs
        recent = (
            select(jobs.c.completed_at, jobs.c.type_name, jobs.c.status)
            .where(jobs.c.completed_at >= bindparam("since", type_=jobs.c.completed_at.type))
            .order_by(jobs.c.completed_at.desc())
            .limit(bindparam("finished_limit"))
            .subquery()
        )
        minute = self.dialect.minute_of(recent.c.completed_at).label("minute")
        return select(minute, recent.c.type_name, recent.c.status, func.count()).group_by(
            minute, recent.c.type_name, recent.c.status
        )

    def find_chains(
        self,
        status: str | None,
        type_name: str | None,
        search: str | None,
        limit: int,
        after: str | None,
    ) -> Query:
        """A page of chains (joined with their last job), newest first."""
        chains, jobs = self.tables.chains, self.tables.jobs
        later = jobs.alias("later")
        last_index = (
            select(func.max(later.c.chain_index))
            .where(later.c.chain_id == jobs.c.chain_id)
            .scalar_subquery()
        )
        # A job that is not completed is always its chain's last (a chain has at most
        # one unfinished job, its last; failing or cancelling ends the chain there), so
        # filtered by such a status the job needs no check that it is the last -- which
        # also leaves Postgres' row estimates intact, so it walks the index in order
        # rather than sorting every job of the status.
        last_job = jobs.c.chain_id == chains.c.id
        if status is None or status == "completed":
            last_job = and_(last_job, jobs.c.chain_index == last_index)
        query = select(*self.chain_columns, *self.job_columns).select_from(
            chains.join(jobs, last_job)
        )
        # Which side orders the page decides the index that serves it:
        # - blocked, failed, cancelled: the jobs of that status in chain order
        #   (jobs_status_chain_ix), stopping after ``limit``;
        # - pending, running: every job of that status through jobs_status_ix, sorted
        #   (the index the hot path keeps anyway; a backlog of 10,000 sorts in a few
        #   milliseconds), with SQLite kept off walking the whole table in chain order;
        # - completed, or no status: the chains, newest first (most chains are
        #   completed, so a page of them is found after few rows).
        order: ColumnElement[Any]
        if status in SETTLED_ASIDE_STATUSES:
            order = jobs.c.chain_id
            query = query.where(
                jobs.c.status == status, self.dialect.partial_index_term(SETTLED_ASIDE)
            )
        elif status is not None and status != "completed":
            order = self.dialect.without_index(jobs.c.chain_id)
            query = query.where(jobs.c.status == status)
        else:
            order = chains.c.id
            if status is not None:
                # Kept off jobs_status_ix: SQLite would read every completed job
                # through it and sort them all to find the newest 50. The chain's own
                # completed_at (set when its last job finished) skips unfinished
                # chains before their jobs are looked up.
                query = query.where(
                    self.dialect.without_index(jobs.c.status) == status,
                    chains.c.completed_at.is_not(None),
                )
        if type_name is not None:
            query = query.where(chains.c.type_name == type_name)
        if search is not None:
            job_chain = select(jobs.c.chain_id).where(jobs.c.id == search).scalar_subquery()
            query = query.where(
                or_(
                    chains.c.id == search,
                    chains.c.id == job_chain,
                    chains.c.dedup_key == search,
                )
            )
        if after is not None:
            query = query.where(order < after)
        return Query(query.order_by(order.desc()).limit(limit), {})

    def blocked_by(self, chain_id: str, limit: int) -> Query:
        """The chains the jobs of ``chain_id`` wait (or waited) for, newest first."""
        return Query(self._blocked_by, {"chain_id": chain_id, "limit": limit})

    @cached_property
    def _blocked_by(self) -> Select[Any]:
        jobs, blockers = self.tables.jobs, self.tables.blockers
        return (
            select(blockers.c.blocker_chain_id)
            .select_from(blockers.join(jobs, jobs.c.id == blockers.c.job_id))
            .where(jobs.c.chain_id == bindparam("chain_id"))
            .group_by(blockers.c.blocker_chain_id)
            .order_by(blockers.c.blocker_chain_id.desc())
            .limit(bindparam("limit"))
        )

    def blocking(self, chain_id: str, limit: int) -> Query:
        """The chains whose jobs wait (or waited) for ``chain_id``, newest first."""
        return Query(self._blocking, {"chain_id": chain_id, "limit": limit})

    @cached_property
    def _blocking(self) -> Select[Any]:
        jobs, blockers = self.tables.jobs, self.tables.blockers
        return (
            select(jobs.c.chain_id)
            .select_from(blockers.join(jobs, jobs.c.id == blockers.c.job_id))
            .where(blockers.c.blocker_chain_id == bindparam("chain_id"))
            .group_by(jobs.c.chain_id)
            .order_by(jobs.c.chain_id.desc())
            .limit(bindparam("limit"))
        )
