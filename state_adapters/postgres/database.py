"""Postgres (psycopg 3, asyncpg; psycopg2 for ``SyncClient``): how statements are
shaped for it (:class:`PostgresSql`, see
:class:`~state_adapters.statements.dialect.SqlDialect` for what each method promises) and
how the adapter uses it (:class:`Postgres`, see
:class:`~state_adapters.database.Database`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, bindparam, func, select, text, true, type_coerce
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement, TextClause

from state_adapters.drivers import (
    async_driver_for,
    run_on_driver,
    run_on_sync_driver,
    sync_driver_for,
    watch_broken_connections,
)
from state_adapters.model import JobRecord
from state_adapters.postgres import pooling
from state_adapters.postgres.statements import (
    NEEDS_TRANSACTION,
    PostgresStatements,
)
from state_adapters.schema import Tables
from state_adapters.statements.chains import ChainStatements
from state_adapters.statements.compiled import CompiledStatements
from state_adapters.statements.queue import JOB_FIELDS, Statements
from state_adapters.statements.records import FirstJob
from state_adapters.steps.completion import Completed, FinishedJob
from state_adapters.steps.limited_claims import LimitedClaim, settled
from state_adapters.steps.pruning import PruningStatements
from state_adapters.transactions.connection_loss import sqlstate_of

if TYPE_CHECKING:
    from state_adapters.database import Conn, Step, T
    from state_adapters.health import HealthThresholds, StorageHealth

# SQLSTATEs after which the whole transaction may simply be retried.
_RETRYABLE_SQLSTATES = {"40001", "40P01"}
_INVALID_TEXT_REPRESENTATION = "22P02"
_JOB_WIDTH = len(JOB_FIELDS)


class PostgresSql:
    """Row locks with ``SKIP LOCKED``, materialized claim CTEs, expanding ``IN`` lists,
    server-made lease tokens, and claims that commit without waiting for the WAL."""

    name = "postgresql"

    def commit_without_flush(self) -> ColumnElement[bool]:
        setting = func.set_config("synchronous_commit", "off", true())
        return select(setting).scalar_subquery().is_not(None)

    def insert_or_ignore(self, table: Any) -> Any:
        return postgresql.insert(table).on_conflict_do_nothing()

    def random_token(self) -> ColumnElement[str]:
        return func.replace(func.cast(func.gen_random_uuid(), postgresql.TEXT), "-", "")

    def claim_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(skip_locked=True, key_share=True)

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(skip_locked=True)

    def id_in_selected(
        self, id_column: ColumnElement[Any], selected: Select[Any]
    ) -> ColumnElement[bool]:
        claimed = selected.cte("selected").prefix_with("MATERIALIZED")
        return id_column.in_(select(claimed.c[0]).scalar_subquery())

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        return column.in_(bindparam(name, expanding=True))

    def without_index(self, expression: ColumnElement[Any]) -> ColumnElement[Any]:
        return expression

    def share_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(read=True)

    def update_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update()

    def partial_index_term(self, predicate: str) -> ColumnElement[bool] | TextClause:
        return true()

    def minute_of(self, instant: ColumnElement[Any]) -> ColumnElement[Any]:
        return type_coerce(func.date_trunc("minute", instant), instant.type)

    def clock(self, given: ColumnElement[Any]) -> ColumnElement[Any]:
        return type_coerce(func.now(), given.type)


class Postgres:
    """The adapter on Postgres: reads and one-statement writes in autocommit (one
    round trip each), row locks, an advisory lock for migrations, and starts and
    completions of any batch size in one statement."""

    completes_with_claims = False
    """The claim and the completions' write run at once on two connections, and so
    on two cores, which is faster than one after the other."""
    starts_in_own_transaction = False
    """A held connection autocommits each statement: a start that takes dedup keys or
    marks blockers needs a transaction of its own (retried on a deadlock)."""

    def __init__(self, engine: AsyncEngine, tables: Tables) -> None:
        dialect = PostgresSql()
        self.sql = Statements(tables, dialect)
        self.chains = ChainStatements(tables, dialect)
        self.reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.single_writer = self.reader
        # The statements a worker repeats go to the driver connection itself.
        driver = async_driver_for(engine.dialect.driver)
        self.compiled = CompiledStatements(engine.dialect, partial(run_on_driver, driver))
        self._own = PostgresStatements(tables)
        self._pruning = PruningStatements(tables, dialect)
        pooling.watch(engine)
        watch_broken_connections(engine.sync_engine, driver)

    def configure(self, engine: AsyncEngine | Engine) -> None:
        """No connection settings; the statements are compiled for ``engine``'s driver
        (psycopg2 binds JSON and takes parameters unlike psycopg) and run on the driver
        connection under its SQLAlchemy connections (the caller's thread, no event loop:
        :func:`~state_adapters.drivers.run_on_sync_driver`); behind a pooler,
        settings that would keep prepared statements are refused
        (:mod:`state_adapters.postgres.pooling`)."""
        driver = sync_driver_for(engine.dialect.driver)
        self.compiled = CompiledStatements(engine.dialect, partial(run_on_sync_driver, driver))
        pooling.watch(engine)
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        watch_broken_connections(sync_engine, driver)

    async def in_transaction(self, conn: AsyncConnection, step: Step[T]) -> T:
        """``step`` as it is: ``conn`` is a lane of the autocommit engine, whose steps are
        one statement each and commit as they run. SQLAlchemy's ``begin()`` and commit
        would send nothing there, yet cost a greenlet hand-over each."""
        return await step(conn)

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
        """One call of ``{prefix}claim_limited`` (migration 0007), in autocommit: the
        lock, the count, the key walk, the claim and the saved window in one round
        trip, one transaction."""
        query = self._own.claim_limited(
            type_name, worker_id=worker_id, leased_until=leased_until, limit=limit, now=now
        )
        rows = await self.compiled(query.statement).rows(conn, query.params)
        outcome = next(row.outcome for row in rows if row.outcome is not None)
        if outcome["control"] != "limited":
            return LimitedClaim(uncontrolled=outcome["control"] == "uncontrolled")
        jobs = [JobRecord(*row[1:]) for row in rows if row.id is not None]
        jobs.sort(key=lambda j: (j.priority, j.scheduled_at, j.id))
        frees_at = outcome["frees_at"]
        return settled(
            jobs,
            limit=limit,
            budget=outcome["budget"],
            rate_bound=outcome["rate_bound"],
            frees_at=None if frees_at is None else datetime.fromtimestamp(frees_at, UTC),
            keyed=outcome["picked"] is not None,  # set by the key walk only
            picked=outcome["picked"] or 0,
            now=datetime.fromtimestamp(outcome["claimed_at"], UTC),
        )

    async def take_migration_lock(self, connection: AsyncConnection, name: str) -> None:
        """A transaction-scoped advisory lock keyed by ``name``."""
        digest = hashlib.sha256(f"queuert-notify:migrate:{name}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, DBAPIError) and _sqlstate(exc) in _RETRYABLE_SQLSTATES

    def needs_transaction(self, exc: BaseException) -> bool:
        return (
            isinstance(exc, DBAPIError)
            and _sqlstate(exc) == _INVALID_TEXT_REPRESENTATION
            and NEEDS_TRANSACTION in str(exc.orig)
        )

    async def insert_first_jobs(
        self, conn: Conn, firsts: Sequence[FirstJob], now: datetime
    ) -> None:
        if len(firsts) == 1:
            query = self._own.insert_first_job(firsts[0].row(now))
        else:
            query = self._own.insert_first_jobs(firsts, now)
        await self.compiled(query.statement).rows(conn, query.params)

    async def storage_health(self, conn: Any, limits: HealthThresholds) -> StorageHealth:
        """Dead rows, the xmin horizon, vacuums (:mod:`state_adapters.postgres.health`)."""
        from state_adapters.postgres import health

        return await health.read(conn, self.sql.tables, limits)

    async def prune_batch(
        self, conn: AsyncConnection, finished_before: datetime, batch_size: int
    ) -> int:
        """The batch in one statement (data-modifying CTEs)."""
        pruned = await conn.execute(*self._pruning.prune_at_once(finished_before, batch_size))
        return int(pruned.rowcount)

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
        """One statement: the completions, the continuations and the chains made final."""
        query = self._own.complete(finished, next_jobs, now, alone=alone, records=records)
        rows = (
            await conn.execute(*query)
            if records
            else await self.compiled(query.statement).rows(conn, query.params)
        )
        done: dict[str, Any] = {}
        finalized: list[tuple[str, bool]] = []
        for row in rows:
            # The job (whole with records, else its id and type), then the chain it made
            # final and whether jobs wait on it.
            done[row[0]] = JobRecord(*row[:_JOB_WIDTH]) if records else row
            chain_id, has_dependents = row.finalized_id, row.has_dependents
            if chain_id is not None:
                finalized.append((chain_id, bool(has_dependents)))
        return Completed(done, finalized)


def _sqlstate(exc: DBAPIError) -> str | None:
    return sqlstate_of(exc.orig)
