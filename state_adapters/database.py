"""What differs between Postgres and SQLite, behind one interface chosen once per
adapter (:func:`database_for`): how statements are shaped (``sql`` and ``chains``,
built on a :class:`~state_adapters.statements.dialect.SqlDialect`), which engine views read
and write, how the adapter's own transactions run, which errors are worth a retry,
and the steps that take a different algorithm on each (inserting new chains,
completing jobs, claiming jobs of a limited type). The adapter asks it and never
tests a dialect itself. Implementations: :class:`state_adapters.postgres.database.Postgres`,
:class:`state_adapters.sqlite.database.Sqlite`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from state_adapters.errors import ConfigurationError, mask_url
from state_adapters.schema import Tables
from state_adapters.sqlite.connections import SqliteSynchronous, check_synchronous
from state_adapters.sqlite.driver import DriverTransaction
from state_adapters.statements.chains import ChainStatements
from state_adapters.statements.compiled import CompiledStatement
from state_adapters.statements.queue import Statements
from state_adapters.statements.records import FirstJob
from state_adapters.steps.completion import Completed, FinishedJob
from state_adapters.steps.limited_claims import LimitedClaim

if TYPE_CHECKING:
    from state_adapters.health import HealthThresholds, StorageHealth

Conn = AsyncConnection | DriverTransaction
"""Where the adapter's repeated statements run: a SQLAlchemy connection, or on
SQLite the driver itself."""

T = TypeVar("T")
Step = Callable[[Conn], Awaitable[T]]
"""Statements run in one transaction of the adapter's own."""

_SUPPORTED = {("postgresql", "psycopg"), ("postgresql", "asyncpg"), ("sqlite", "aiosqlite")}
ASYNC_URLS = "postgresql+psycopg://, postgresql+asyncpg:// and sqlite+aiosqlite://"
"""The engines :func:`database_for` accepts, as a user writes their URLs."""


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
    starts_in_own_transaction: bool
    """Whether every start without a caller's session (dedup keys and blockers
    included) runs through :meth:`in_transaction`, whose steps are then one
    transaction whatever they do (SQLite); otherwise only plain starts do, and the
    others take :class:`~state_adapters.transactions.calls.Transactions`' retried ones."""

    def compiled(self, statement: Executable) -> CompiledStatement:
        """``statement`` compiled once for this engine (statements of fixed shape only)."""
        ...

    async def in_transaction(self, conn: AsyncConnection, step: Step[T]) -> T:
        """``step`` in a transaction of the adapter's own on ``conn``, for the statements
        it repeats (claims, completions, plain starts, lease renewals): committed when
        the step returns, rolled back if it raises. A step awaits only its connection's
        statements (on SQLite it runs in the driver's thread:
        :mod:`state_adapters.sqlite.driver`)."""
        ...

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
        """Claim up to ``limit`` due jobs of ``type_name`` within its limits
        (:mod:`state_adapters.steps.limited_claims`), in ``conn``'s transaction (Postgres:
        autocommit, one statement; SQLite: a write transaction)."""
        ...

    def configure(self, engine: AsyncEngine | Engine) -> None:
        """Give another engine on this database the connection settings the queue
        needs, and compile :meth:`compiled` statements for its driver where it binds
        parameters differently, since its connections then run them (``SyncClient``'s
        sync engine)."""
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

    async def insert_first_jobs(
        self, conn: Conn, firsts: Sequence[FirstJob], now: datetime
    ) -> None:
        """Insert new chains and their first jobs, created at ``now``."""
        ...

    async def storage_health(self, conn: Any, limits: HealthThresholds) -> StorageHealth:
        """What this database tells of the queue's health, judged against ``limits``
        (:mod:`state_adapters.health`); reads only, on ``conn``."""
        ...

    async def prune_batch(
        self, conn: AsyncConnection, finished_before: datetime, batch_size: int
    ) -> int:
        """Delete one batch of retention in ``conn``'s transaction
        (:mod:`state_adapters.steps.pruning`); the chains deleted."""
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
    """The database of ``engine`` (see :data:`ASYNC_URLS`);
    raises ``ConfigurationError`` for any other driver or a bad setting."""
    check_supported(engine)
    check_synchronous(sqlite_synchronous)
    # Each imported here: it loads its database's SQLAlchemy dialect package (and
    # Postgres the drivers' interface), which a process on the other never needs.
    if engine.dialect.name == "postgresql":
        from state_adapters.postgres.database import Postgres

        return Postgres(engine, tables)
    from state_adapters.sqlite.database import Sqlite

    return Sqlite(engine, tables, synchronous=sqlite_synchronous)


def check_supported(engine: AsyncEngine) -> None:
    """Raise ``ConfigurationError`` unless ``engine`` is an ``AsyncEngine`` whose driver is
    one of :data:`ASYNC_URLS` (a synchronous engine's error names ``SyncClient``)."""
    if not isinstance(engine, AsyncEngine):
        hint = (
            f" ({engine.dialect.name}+{engine.dialect.driver}); a synchronous engine "
            "belongs to queuert_notify.SyncClient"
            if isinstance(engine, Engine)
            else ""
        )
        raise ConfigurationError(
            "SqlAlchemyStateAdapter needs an AsyncEngine "
            f"(sqlalchemy.ext.asyncio.create_async_engine) on {ASYNC_URLS}, "
            f"got {type(engine).__name__}{hint}"
        )
    dialect = engine.dialect
    if (dialect.name, dialect.driver) not in _SUPPORTED:
        url = mask_url(engine.url.render_as_string(hide_password=False))
        raise ConfigurationError(
            f"unsupported database {dialect.name}+{dialect.driver} ({url}); "
            f"SqlAlchemyStateAdapter supports {ASYNC_URLS} URLs"
        )
