"""What differs between Postgres and SQLite, behind one interface chosen once per
adapter (:func:`database_for`): how statements are shaped (``sql`` and ``chains``,
built on a :class:`~state_adapters.sql_dialect.SqlDialect`), which engine views read
and write, how the adapter's own transactions run, which errors are worth a retry,
and the two steps that take a different algorithm on each (inserting new chains,
completing jobs). The adapter asks it and never tests a dialect itself.
Implementations: :class:`state_adapters.postgres.Postgres`,
:class:`state_adapters.sqlite.Sqlite`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from state_adapters.chain_statements import ChainStatements
from state_adapters.compiled import CompiledStatement
from state_adapters.completion import Completed, FinishedJob
from state_adapters.errors import ConfigurationError, mask_url
from state_adapters.schema import Tables
from state_adapters.sqlite_connections import SqliteSynchronous, check_synchronous
from state_adapters.sqlite_driver import DriverTransaction
from state_adapters.statements import Statements

Conn = AsyncConnection | DriverTransaction
"""Where the adapter's repeated statements run: a SQLAlchemy connection, or on
SQLite the driver itself."""

_SUPPORTED = {("postgresql", "psycopg"), ("sqlite", "aiosqlite")}


class Database(Protocol):
    """One database's ways, for one table set on one engine."""

    sql: Statements
    """The queue's statements, shaped for this database."""
    chains: ChainStatements
    """Reads and chain actions, shaped for this database."""
    reader: AsyncEngine
    """The engine view for statements that only read."""
    single_writer: AsyncEngine
    """The engine view for a write that is one statement."""
    completes_with_claims: bool
    """Whether a worker should hand waiting completions to its next claim (one
    transaction) rather than write them alongside it."""

    def compiled(self, statement: Executable) -> CompiledStatement:
        """``statement`` compiled once for this engine (statements of fixed shape only)."""
        ...

    def transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[Conn]:
        """A transaction of the adapter's own on ``conn`` for the statements it repeats
        (claims, completions, plain starts), committed when the block ends."""
        ...

    def locking_transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[Conn]:
        """A transaction on ``conn`` (a held connection) that keeps the locks its
        statements take until it ends, committed when the block ends and rolled back
        if it raises (a claim of a limited type: :mod:`state_adapters.limited_claims`)."""
        ...

    def configure(self, engine: AsyncEngine | Engine) -> None:
        """Give another engine on this database the connection settings the queue
        needs (``SyncClient``'s sync engine)."""
        ...

    async def take_migration_lock(self, connection: AsyncConnection, name: str) -> None:
        """Serialize migrations of one table set across processes, until commit."""
        ...

    def is_retryable(self, exc: BaseException) -> bool:
        """True for a deadlock or serialization failure: retrying the transaction is safe."""
        ...

    def needs_transaction(self, exc: BaseException) -> bool:
        """True when a completion run alone (``alone=True``) refused because it must run
        in a transaction; it wrote nothing."""
        ...

    async def insert_first_jobs(self, conn: Conn, job_rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert new chains and their first jobs, given the first jobs' rows."""
        ...

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
        """Complete leased jobs whose tokens still hold, create the next jobs of
        continued chains (rows with ``previous_id``, only if that job completed) and
        make finished chains final. ``alone``: ``conn`` is not in a transaction of
        its own (Postgres autocommit); ``records``: return whole job records."""
        ...


def database_for(
    engine: AsyncEngine, tables: Tables, *, sqlite_synchronous: SqliteSynchronous
) -> Database:
    """The database of ``engine`` (``postgresql+psycopg`` or ``sqlite+aiosqlite``);
    raises ``ConfigurationError`` for any other driver or a bad setting."""
    check_supported(engine)
    check_synchronous(sqlite_synchronous)
    if engine.dialect.name == "postgresql":
        from state_adapters.postgres import Postgres

        return Postgres(engine, tables)
    from state_adapters.sqlite import Sqlite

    return Sqlite(engine, tables, synchronous=sqlite_synchronous)


def check_supported(engine: AsyncEngine) -> None:
    """Raise ``ConfigurationError`` unless the engine is Postgres/psycopg or SQLite/aiosqlite."""
    dialect = engine.dialect
    if (dialect.name, dialect.driver) not in _SUPPORTED:
        url = mask_url(engine.url.render_as_string(hide_password=False))
        raise ConfigurationError(
            f"unsupported database {dialect.name}+{dialect.driver} ({url}); "
            "SqlAlchemyStateAdapter supports postgresql+psycopg:// and sqlite+aiosqlite:// URLs"
        )
