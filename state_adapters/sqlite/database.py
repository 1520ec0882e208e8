"""SQLite (aiosqlite): how statements are shaped for it (:class:`SqliteSql`, see
:class:`~state_adapters.statements.dialect.SqlDialect` for what each method promises) and
how the adapter uses it (:class:`Sqlite`, see :class:`~state_adapters.database.Database`).
Every write transaction holds the database (``BEGIN IMMEDIATE``), so row locks are
not needed and are left out."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    Select,
    String,
    Update,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    text,
    true,
    type_coerce,
)
from sqlalchemy import update as update_rows
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement, TextClause, UnaryExpression
from sqlalchemy.sql.operators import custom_op

from state_adapters.model import JobRecord
from state_adapters.schema import Tables, UtcDateTime
from state_adapters.sqlite.connections import READ_ONLY, SqliteSynchronous, configure_engine
from state_adapters.sqlite.driver import run_transaction
from state_adapters.statements.chains import ChainStatements
from state_adapters.statements.compiled import CompiledStatements
from state_adapters.statements.limited_claims import LimitedClaimStatements
from state_adapters.statements.queue import Query, Statements, job_columns
from state_adapters.statements.records import FirstJob
from state_adapters.steps.completion import Completed, FinishedJob
from state_adapters.steps.finishing import finalize
from state_adapters.steps.limited_claims import LimitedClaim, claim_type
from state_adapters.steps.pruning import PruningStatements, prune_chains

if TYPE_CHECKING:
    from state_adapters.database import Conn, Step, T
    from state_adapters.health import HealthThresholds, StorageHealth


_UNSET = frozenset(
    {"output", "progress", "completed_at", "last_error", "leased_by", "lease_token", "leased_until"}
)
"""The jobs table's columns a new job has no value in (``records.job_row``: None)."""


class SqliteSql:
    """One-shape ``IN`` lists through ``json_each`` (so statements compile once),
    ``+column`` terms that keep the planner off the wrong index, tokens from
    ``randomblob``."""

    name = "sqlite"

    def commit_without_flush(self) -> ColumnElement[bool]:
        return true()

    def insert_or_ignore(self, table: Any) -> Any:
        return sqlite.insert(table).on_conflict_do_nothing()

    def random_token(self) -> ColumnElement[str]:
        return func.lower(func.hex(func.randomblob(16)))

    def claim_lock(self, select: Select[Any]) -> Select[Any]:
        return select

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select

    def id_in_selected(
        self, id_column: ColumnElement[Any], selected: Select[Any]
    ) -> ColumnElement[bool]:
        return id_column.in_(selected.scalar_subquery())

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        values = func.json_each(bindparam(name, type_=JSON())).table_valued("value")
        return column.in_(select(values.c.value).scalar_subquery())

    def without_index(self, expression: ColumnElement[Any]) -> ColumnElement[Any]:
        return UnaryExpression(expression, operator=custom_op("+"), type_=expression.type)

    def share_lock(self, select: Select[Any]) -> Select[Any]:
        return select

    def update_lock(self, select: Select[Any]) -> Select[Any]:
        return select

    def partial_index_term(self, predicate: str) -> ColumnElement[bool] | TextClause:
        return text(predicate)

    def minute_of(self, instant: ColumnElement[Any]) -> ColumnElement[Any]:
        return type_coerce(func.strftime("%Y-%m-%d %H:%M:00", instant), instant.type)

    def clock(self, given: ColumnElement[Any]) -> ColumnElement[Any]:
        return given


class Sqlite:
    """The adapter on SQLite: one writer at a time (``BEGIN IMMEDIATE``), readers in
    deferred transactions, the adapter's own transactions sent to the driver itself
    (:mod:`state_adapters.sqlite.driver`), and completions written step by step in
    statements that compile once."""

    completes_with_claims = True
    """One writer at a time: a transaction saved is time saved."""
    starts_in_own_transaction = True
    """``BEGIN IMMEDIATE`` makes every step one transaction, run by one writer at a time."""

    def __init__(
        self, engine: AsyncEngine, tables: Tables, *, synchronous: SqliteSynchronous
    ) -> None:
        self._synchronous = synchronous
        self.configure(engine)
        dialect = SqliteSql()
        self.sql = Statements(tables, dialect)
        self.chains = ChainStatements(tables, dialect)
        self._limited = LimitedClaimStatements(tables, dialect)
        self.reader = engine.execution_options(**{READ_ONLY: True})
        # The engine itself, so the write begins IMMEDIATE.
        self.single_writer = engine
        self.compiled = CompiledStatements(engine.dialect)
        self._tables = tables
        self._job_columns = job_columns(tables)
        self._pruning = PruningStatements(tables, dialect)

    async def storage_health(self, conn: Any, limits: HealthThresholds) -> StorageHealth:
        """The WAL and the pages (:mod:`state_adapters.sqlite.health`)."""
        from state_adapters.sqlite import health

        return await health.read(conn, limits)

    async def prune_batch(
        self, conn: AsyncConnection, finished_before: datetime, batch_size: int
    ) -> int:
        """The batch statement by statement, skipping those with nothing to delete."""
        return await prune_chains(conn, self._pruning, finished_before, batch_size)

    def configure(self, engine: AsyncEngine | Engine) -> None:
        """WAL, the busy timeout, ``synchronous`` and ``BEGIN IMMEDIATE``
        (:mod:`state_adapters.sqlite.connections`)."""
        configure_engine(engine, synchronous=self._synchronous)

    async def in_transaction(self, conn: AsyncConnection, step: Step[T]) -> T:
        """One trip to the driver's thread (:mod:`state_adapters.sqlite.driver`)."""
        return await run_transaction(conn, self.compiled, step)

    async def claim_limited(
        self,
        conn: Conn,
        type_name: str,
        *,
        worker_id: str,
        leased_until: datetime,
        limit: int,
        now: datetime,
    ) -> LimitedClaim:
        """:func:`~state_adapters.steps.limited_claims.claim_type`, statements of the write
        transaction ``conn`` (``BEGIN IMMEDIATE`` holds the database)."""
        return await claim_type(
            self._limited,
            conn,
            type_name,
            worker_id=worker_id,
            leased_until=leased_until,
            limit=limit,
            now=now,
        )

    async def take_migration_lock(self, connection: AsyncConnection, name: str) -> None:
        """Nothing to take: the transaction began with ``BEGIN IMMEDIATE``, which
        excludes every other writer."""

    def is_retryable(self, exc: BaseException) -> bool:
        return False

    def needs_transaction(self, exc: BaseException) -> bool:
        return False

    async def insert_first_jobs(
        self, conn: Conn, firsts: Sequence[FirstJob], now: datetime
    ) -> None:
        """Two executemany inserts: the chains, then their first jobs."""
        job_rows = [first.row(now) for first in firsts]
        await conn.execute(*self.sql.insert_chains(job_rows))
        await conn.execute(self._insert_new_jobs, list(job_rows))

    @cached_property
    def _insert_new_jobs(self) -> Insert:
        """A new job's insert names only the columns it has a value in (the rest, output,
        progress and the lease's, stay NULL, as on Postgres): 15 parameters to bind per
        row instead of 22, a measurable part of an enqueue here (docs/benchmarks.md,
        "Django task backend")."""
        jobs = self._tables.jobs
        return insert(jobs).values(
            {c.name: bindparam(c.name, type_=c.type) for c in jobs.c if c.name not in _UNSET}
        )

    async def complete(
        self,
        conn: Conn,
        finished: Sequence[FinishedJob],
        next_jobs: Sequence[Mapping[str, Any]],
        now: datetime,
        *,
        alone: bool,
        records: bool,
    ) -> Completed:
        """The completions in one statement, then the continuations of those that
        held, then the chains they made final."""
        rows = await conn.execute(*self._complete_leased(finished, now, records=records))
        done: dict[str, Any] = {row.id: JobRecord(*row) if records else row for row in rows}
        created = []
        for next_job in next_jobs:
            new = dict(next_job)
            previous = done.get(new.pop("previous_id"))
            if previous is not None:
                new.update(chain_id=previous.chain_id, chain_index=previous.chain_index + 1)
                if new["concurrency_key"] is None:
                    new["concurrency_key"] = previous.concurrency_key
                created.append(new)
        if created:
            await conn.execute(*self.sql.insert_jobs(created))
        finishing = [done[f.job_id].chain_id for f in finished if f.finishes and f.job_id in done]
        return Completed(done, await finalize(self, conn, finishing, now))

    def _complete_leased(
        self, finished: Sequence[FinishedJob], now: datetime, *, records: bool
    ) -> Query:
        """Complete each job whose lease token still matches, in one statement of fixed
        shape fed with one JSON document (so it compiles once, whatever the batch
        size); returns the completed rows, whole with ``records`` or else ``id``,
        ``type_name``, ``chain_id``, ``chain_index`` and ``concurrency_key``. Outputs
        are embedded as JSON text and stored as they are."""
        batch = [
            {"id": f.job_id, "token": f.lease_token, "output": json.dumps(f.output)}
            for f in finished
        ]
        statement = self._complete_leased_records if records else self._complete_leased_ids
        return Query(statement, {"batch": json.dumps(batch), "now": now})

    @cached_property
    def _complete_leased_records(self) -> Update:
        return self._complete_leased_rows.returning(*self._job_columns)

    @cached_property
    def _complete_leased_ids(self) -> Update:
        jobs = self._tables.jobs
        return self._complete_leased_rows.returning(
            jobs.c.id,
            jobs.c.type_name,
            jobs.c.chain_id,
            jobs.c.chain_index,
            jobs.c.concurrency_key,
        )

    @cached_property
    def _complete_leased_rows(self) -> Update:
        jobs = self._tables.jobs
        given = func.json_each(bindparam("batch", type_=String())).table_valued(
            "value", name="given"
        )

        def field(name: str) -> ColumnElement[Any]:
            return func.json_extract(given.c.value, literal_column(f"'$.{name}'"))

        return (
            update_rows(jobs)
            .where(
                jobs.c.id == field("id"),
                jobs.c.lease_token == field("token"),
                # By primary key from the document, not by scanning running jobs.
                self.sql.dialect.without_index(jobs.c.status) == "running",
            )
            .values(
                status="completed",
                output=field("output"),
                completed_at=bindparam("now", type_=UtcDateTime()),
                leased_until=None,
            )
        )
