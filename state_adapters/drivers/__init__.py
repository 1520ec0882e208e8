"""The DB-API drivers under SQLAlchemy's Postgres engines, behind one small interface
chosen once per engine by :func:`driver_for`: what the queue must know of a driver that
SQLAlchemy does not say, and, for the asyncio drivers, how the statements a worker
repeats run on the driver connection itself (:func:`run_on_driver`). One module per
driver."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Protocol, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect, Engine, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.util import greenlet_spawn

from state_adapters.migrations import missing_tables
from state_adapters.sync.bridge import SyncConnection
from state_adapters.transactions.checkout import pooled_connection


class Driver(Protocol):
    """One Postgres driver, as the queue sees it."""

    name: str
    """SQLAlchemy's name of the driver (``dialect.driver``)."""

    pooler_connect_args: dict[str, Any]
    """``connect_args`` of an engine whose connections keep no statement prepared on the
    server past the transaction that ran it (which a pooler in transaction mode hands
    to another server connection)."""

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        """Whether this connection may reuse, in a later transaction, a statement it
        prepared on the server (it was made without :attr:`pooler_connect_args`)."""
        ...

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        """The backend process id the server announced when the connection opened; a
        pooler announces one of its own, unlike ``pg_backend_pid()``."""
        ...

    def leaves_connection_broken(self, error: BaseException) -> bool:
        """Whether ``error`` (as SQLAlchemy's DB-API layer raises it) leaves its
        connection unusable though the dialect's ``is_disconnect`` does not say so."""
        ...


class AsyncDriver(Driver, Protocol):
    """A driver of SQLAlchemy's asyncio engines."""

    async def fetch(
        self, dbapi_connection: Any, sql: str, arguments: Any, kept: dict[Any, Any]
    ) -> Sequence[Any]:
        """Run ``sql`` (compiled for this driver) with ``arguments`` on the driver
        connection under ``dbapi_connection`` (SQLAlchemy's adapted DB-API connection),
        in its transaction -- begun first where SQLAlchemy begins lazily, so that the
        statement never runs outside the caller's transaction -- and return its rows.
        Errors are raised as SQLAlchemy's DB-API layer raises them (the dialect's
        ``loaded_dbapi`` exceptions). ``kept``: the pool's ``info`` dictionary of that
        DB-API connection, for what the driver reuses from one statement to the next
        (discarded with the connection, when it is closed or invalidated)."""
        ...


class SyncDriver(Driver, Protocol):
    """A driver of SQLAlchemy's sync engines (``SyncClient``)."""

    def fetch_sync(self, dbapi_connection: Any, sql: str, arguments: Any) -> Sequence[Any]:
        """Run ``sql`` (compiled for this driver) with ``arguments`` on
        ``dbapi_connection``, in its transaction (the driver opens one on a connection's
        first statement, as under SQLAlchemy), and return its rows."""
        ...


POSTGRES_DRIVERS = ("psycopg", "asyncpg", "psycopg2")
"""SQLAlchemy's names of the Postgres drivers the queue accepts."""


def driver_for(name: str) -> Driver:
    """The Postgres driver SQLAlchemy calls ``name`` (one of :data:`POSTGRES_DRIVERS`)."""
    if name == "psycopg2":
        from state_adapters.drivers.psycopg2 import Psycopg2

        return Psycopg2()
    return async_driver_for(name)


def sync_driver_for(name: str) -> SyncDriver:
    """The sync Postgres driver SQLAlchemy calls ``name`` (psycopg or psycopg2)."""
    if name == "psycopg2":
        from state_adapters.drivers.psycopg2 import Psycopg2

        return Psycopg2()
    from state_adapters.drivers.psycopg import Psycopg

    return Psycopg()


def async_driver_for(name: str) -> AsyncDriver:
    """The asyncio Postgres driver SQLAlchemy calls ``name`` (psycopg or asyncpg)."""
    if name == "asyncpg":
        from state_adapters.drivers.asyncpg import Asyncpg

        return Asyncpg()
    from state_adapters.drivers.psycopg import Psycopg

    return Psycopg()


async def run_on_driver(
    driver: AsyncDriver, conn: AsyncConnection, sql: str, arguments: Any
) -> Sequence[Any]:
    """``sql`` on the driver connection under ``conn``, in ``conn``'s transaction (the
    caller's session's, or the adapter's own), as SQLAlchemy would run it but without its
    per-statement work: the engine's ``before_cursor_execute`` / ``after_cursor_execute``
    listeners are called (with no cursor, and a blank object as the context), a driver
    error is raised as ``DBAPIError`` (a missing queue table as
    :mod:`state_adapters.migrations.missing_tables` says) and a disconnect invalidates the
    connection."""
    fairy = await pooled_connection(conn)
    sync = conn.sync_connection
    assert sync is not None  # a connection that handed out its raw connection is open
    dbapi_connection = fairy.dbapi_connection
    dialect = conn.dialect
    try:
        # Listeners run where SQLAlchemy runs them: in a greenlet that may await IO. The
        # context is a blank object a listener may keep its own attributes on (tracing
        # instrumentations keep their span there from one event to the next).
        context = SimpleNamespace()
        if sync.dispatch.before_cursor_execute:
            event = sync.dispatch.before_cursor_execute
            await greenlet_spawn(event, sync, None, sql, arguments, context, False)
        rows = await driver.fetch(dbapi_connection, sql, arguments, fairy.info)
        if sync.dispatch.after_cursor_execute:
            event = sync.dispatch.after_cursor_execute
            await greenlet_spawn(event, sync, None, sql, arguments, context, False)
        return rows
    except dialect.loaded_dbapi.Error as exc:
        wrapped = _wrapped(sync, dbapi_connection, exc, sql, arguments)
        if wrapped.connection_invalidated and not conn.invalidated:
            await conn.invalidate(exc)
        raise wrapped from exc


async def run_on_sync_driver(
    driver: SyncDriver, conn: SyncConnection, sql: str, arguments: Any
) -> Sequence[Any]:
    """:func:`run_on_driver` for ``SyncClient``: on the sync driver connection under
    ``conn``, on the calling thread; awaits nothing (see
    :func:`state_adapters.sync.bridge.run_to_completion`)."""
    sync = conn.sync_connection
    dbapi_connection = sync.connection.dbapi_connection
    try:
        context = SimpleNamespace()
        if sync.dispatch.before_cursor_execute:
            sync.dispatch.before_cursor_execute(sync, None, sql, arguments, context, False)
        rows = driver.fetch_sync(dbapi_connection, sql, arguments)
        if sync.dispatch.after_cursor_execute:
            sync.dispatch.after_cursor_execute(sync, None, sql, arguments, context, False)
        return rows
    except sync.dialect.loaded_dbapi.Error as exc:
        wrapped = _wrapped(sync, dbapi_connection, exc, sql, arguments)
        if wrapped.connection_invalidated and not sync.invalidated:
            sync.invalidate(exc)
        raise wrapped from exc


def watch_broken_connections(engine: Engine, driver: Driver) -> None:
    """From now on, an error after which ``driver`` leaves a connection of ``engine``
    unusable is a disconnect to SQLAlchemy: the connection is invalidated (not handed
    out again) and the error has ``connection_invalidated`` set, so callers retry it as
    a lost connection (:mod:`state_adapters.transactions.connection_loss`). Idempotent."""
    if event.contains(engine, "handle_error", _broken_connection):
        return
    _BROKEN[engine.dialect] = driver
    event.listen(engine, "handle_error", _broken_connection)


_BROKEN: weakref.WeakKeyDictionary[Dialect, Driver] = weakref.WeakKeyDictionary()
"""The driver of each watched engine, by its dialect: the engines made from it with
``execution_options`` share it."""


def _broken_connection(context: ExceptionContext) -> None:
    driver = _BROKEN.get(context.dialect)
    error = context.sqlalchemy_exception
    if driver is not None and error is not None and driver.leaves_connection_broken(error):
        context.is_disconnect = True


def _wrapped(
    sync: Connection, dbapi_connection: Any, exc: Exception, sql: str, arguments: Any
) -> DBAPIError:
    """``exc`` as SQLAlchemy raises a driver's error (``connection_invalidated`` set for
    a disconnect); a missing queue table is raised as its ``ConfigurationError``."""
    dialect = sync.dialect
    missing = missing_tables.error(dialect, exc)
    if missing is not None:
        raise missing from None
    disconnect = dialect.is_disconnect(exc, dbapi_connection, None)  # type: ignore[arg-type]
    wrapped = cast(
        DBAPIError,
        DBAPIError.instance(
            sql,
            arguments,
            exc,
            dialect.loaded_dbapi.Error,
            connection_invalidated=disconnect,
            dialect=dialect,
        ),
    )
    if not disconnect:
        driver = _BROKEN.get(dialect)
        wrapped.connection_invalidated = driver is not None and driver.leaves_connection_broken(
            wrapped
        )
    return wrapped
