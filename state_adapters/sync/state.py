"""Job state on a synchronous SQLAlchemy ``Engine``, for ``SyncClient``.

The SQL, validation and deduplication are :class:`SqlAlchemyStateAdapter`'s own,
run on the caller's thread through :mod:`state_adapters.sync.bridge`; this module
adds what a synchronous caller needs around them: its ``Session`` or
``Connection`` (the write joins that transaction and never commits it), or a
transaction of its own, and the hand-over of the notifications the write owes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from state_adapters.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    cannot_connect,
    cannot_connect_reason,
    mask_url,
    unreachable,
)
from state_adapters.migrations import missing_tables
from state_adapters.notifications import NotificationBuffer
from state_adapters.schema import DEFAULT_TABLE_PREFIX
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from state_adapters.sync.bridge import SyncConnection, run_to_completion
from state_adapters.transactions.after_commit import CommitSink, buffer_for_transaction
from state_adapters.transactions.connection_loss import is_connection_loss

T = TypeVar("T")

Work = Callable[
    ["SqlAlchemyStateAdapter", SyncConnection, NotificationBuffer], Coroutine[Any, Any, T]
]
"""A call of the async adapter, given a bridged connection and a notification buffer."""

SyncSession = Session | Connection | None
"""The caller's transaction: an ORM ``Session``, a Core ``Connection``, or ``None``
for a transaction of the call's own."""

_DRIVERS = {
    ("postgresql", "psycopg"): "psycopg",
    ("postgresql", "psycopg2"): "psycopg",
    ("sqlite", "pysqlite"): "aiosqlite",
}
"""Supported sync drivers, and an async driver of the same database the adapter is
built on (its statements are then compiled for the sync driver: ``configure``)."""
SYNC_URLS = "postgresql+psycopg://, postgresql+psycopg2:// and sqlite://"


class Announcer(CommitSink):
    """Where a synchronous write's notifications go: inside its transaction
    (Postgres NOTIFY) and/or once it committed."""

    def in_transaction(self, connection: Connection, notes: NotificationBuffer) -> None:
        """On the writing connection, before COMMIT (nothing by default)."""

    def after_commit(self, notes: NotificationBuffer, outcome: Callable[[], bool | None]) -> None:
        """Once COMMIT is on its way (nothing by default); must not block."""

    def close(self, limit: float) -> None:
        """Send what is owed, waiting at most ``limit`` seconds (nothing by default)."""


class SyncStateAdapter:
    """Starts, reads and changes chains on a sync ``Engine`` (:data:`SYNC_URLS`), in the
    caller's transaction or one of its own. Thread-safe: every call takes its own
    connection (or the caller's)."""

    def __init__(self, engine: Engine, *, table_prefix: str = DEFAULT_TABLE_PREFIX) -> None:
        if isinstance(engine, AsyncEngine):
            raise TypeError(
                "SyncClient takes a synchronous Engine (sqlalchemy.create_engine) on "
                f"{SYNC_URLS}; an AsyncEngine ({engine.dialect.name}+{engine.dialect.driver}) "
                "belongs to queuert_notify.Client"
            )
        if not isinstance(engine, Engine):
            raise TypeError(f"SyncClient takes an sqlalchemy Engine, got {type(engine).__name__}")
        dialect = engine.dialect
        driver = _DRIVERS.get((dialect.name, dialect.driver))
        if driver is None:
            hint = (
                f": {dialect.driver} is an async driver, give create_async_engine's engine "
                "to queuert_notify.Client"
                if dialect.is_async
                else ""
            )
            raise ConfigurationError(
                f"unsupported database {dialect.name}+{dialect.driver}; SyncClient supports "
                f"{SYNC_URLS} engines{hint}"
            )
        self.engine = engine
        # Never connected: it compiles the statements for the same database.
        twin = create_async_engine(engine.url.set(drivername=f"{dialect.name}+{driver}"))
        self.state = SqlAlchemyStateAdapter(twin, table_prefix=table_prefix)
        self.state.database.configure(engine)
        missing_tables.watch(engine, self.state.tables)

    def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the queue's tables, as ``SqlAlchemyStateAdapter.migrate``."""
        from state_adapters.migrations.runner import upgrade

        tables = self.state.tables
        try:
            connection = self.engine.connect()
        except DBAPIError as exc:
            raise unreachable(self.engine.url, exc) from None
        with connection, connection.begin():
            lock = self.state.database.take_migration_lock(
                SyncConnection(connection),  # type: ignore[arg-type]
                f"{tables.schema}.{tables.table_prefix}",
            )
            run_to_completion(lock)
            upgrade(connection, tables, adopt=adopt)

    def write(self, session: SyncSession, announcer: Announcer, work: Work[T]) -> T:
        """``work`` in the caller's transaction (never committed here) or in one of its
        own; its notifications go to ``announcer`` inside the transaction and after its
        COMMIT (none on rollback, none for a savepoint that rolled back)."""
        if session is None:
            notes = NotificationBuffer()
            with self._connect() as conn, conn.begin():
                result = run_to_completion(work(self.state, SyncConnection(conn), notes))
                announcer.in_transaction(conn, notes)
            announcer.after_commit(notes, _committed)
            return result
        connection = _connection_of(session)
        # Taken before the write: it notes the savepoint the write happens in.
        owed = buffer_for_transaction(session, announcer)
        notes = NotificationBuffer()
        result = run_to_completion(work(self.state, SyncConnection(connection), notes))
        announcer.in_transaction(connection, notes)
        owed.absorb(notes)
        return result

    def read(self, session: SyncSession, work: Work[T]) -> T:
        """``work`` that writes nothing, on the caller's connection or a pooled one."""
        if session is not None:
            connection = _connection_of(session)
            return run_to_completion(work(self.state, SyncConnection(connection), _NOTHING))
        with self._connect() as conn:
            return run_to_completion(work(self.state, SyncConnection(conn), _NOTHING))

    def _connect(self) -> Connection:
        """A pooled connection; a database that does not answer is one
        ``DatabaseUnavailableError`` line naming it (no retries: the caller's thread
        is a request's)."""
        try:
            return self.engine.connect()
        except DBAPIError as exc:
            if not is_connection_loss(exc):
                raise
            address = mask_url(self.engine.url.render_as_string(hide_password=False))
            reason = cannot_connect_reason(exc, self.engine.url.password)
            raise DatabaseUnavailableError(cannot_connect(address, reason, sqlite=False)) from None


_NOTHING = NotificationBuffer()


def _connection_of(session: object) -> Connection:
    if isinstance(session, Session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    hint = (
        ": an AsyncSession or AsyncConnection belongs to queuert_notify.Client"
        if isinstance(session, AsyncSession | AsyncConnection)
        else ""
    )
    raise TypeError(f"session must be a Session or Connection, got {type(session).__name__}{hint}")


def _committed() -> bool:
    return True
