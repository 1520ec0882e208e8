"""How engines and connections differ between Postgres and SQLite: which are
supported (``postgresql+psycopg`` and ``sqlite+aiosqlite``), SQLite's connection
settings, readers and the single writer, the migration lock, and which errors are
worth retrying. How *statements* differ is :mod:`state_adapters.sql_dialect`'s.

SQLite engines are configured once, through events on the sync engine:

- ``connect``: WAL journal, a long ``busy_timeout``, ``synchronous`` (``NORMAL``
  by default, see :data:`SQLITE_SYNCHRONOUS`), and the driver's own transaction
  handling switched off (``isolation_level = None``);
- ``begin``: every transaction starts with ``BEGIN IMMEDIATE``, so a writer
  takes the write lock up front and waits (up to the busy timeout) instead of
  failing with "database is locked" when it upgrades a read lock later.

These hooks apply to every connection of that engine, including the
application's own sessions: on SQLite all transactions on the engine are
write transactions and run one at a time (readers in other connections are
not blocked, thanks to WAL).
"""

from __future__ import annotations

import hashlib
import sqlite3
import weakref
from typing import Any, Literal

from sqlalchemy import event, literal_column, text
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.errors import ConfigurationError, mask_url

SQLITE_BUSY_TIMEOUT_MS = 60_000
"""How long a SQLite writer waits for the write lock before "database is locked"."""

SqliteSynchronous = Literal["NORMAL", "FULL"]
SQLITE_SYNCHRONOUS: SqliteSynchronous = "NORMAL"
"""The default ``PRAGMA synchronous`` of SQLite connections.

Under WAL, ``NORMAL`` syncs the log at checkpoints rather than at every commit:
a committed transaction survives the process crashing or being killed (the
log is in the OS's hands), and the file is never corrupted, but a power loss
or an OS crash may undo the last transactions before the next checkpoint.
``FULL`` syncs at every commit (about ten times slower per transaction here),
for data that must survive power loss.
"""

_SUPPORTED = {("postgresql", "psycopg"), ("sqlite", "aiosqlite")}
_SQLITE_READY = "queuert_sqlite_ready"
# Each engine's choice, keyed by its dialect: shared by its execution-option views
# and kept across dispose().
_SYNCHRONOUS: weakref.WeakKeyDictionary[Dialect, SqliteSynchronous] = weakref.WeakKeyDictionary()
_READ_ONLY = "queuert_read_only"
# Postgres SQLSTATEs after which the whole transaction may simply be retried.
_RETRYABLE_SQLSTATES = {"40001", "40P01"}
_INVALID_TEXT_REPRESENTATION = "22P02"
NEEDS_TRANSACTION = "queuert: a finished chain has dependents; complete it in a transaction"
"""Raised from SQL (as invalid integer text) by a one-statement completion that must
run in a transaction instead; the statement then wrote nothing."""


def check_supported(engine: AsyncEngine) -> None:
    """Raise ``ConfigurationError`` unless the engine is Postgres/psycopg or SQLite/aiosqlite."""
    dialect = engine.dialect
    if (dialect.name, dialect.driver) not in _SUPPORTED:
        url = mask_url(engine.url.render_as_string(hide_password=False))
        raise ConfigurationError(
            f"unsupported database {dialect.name}+{dialect.driver} ({url}); "
            "SqlAlchemyStateAdapter supports postgresql+psycopg:// and sqlite+aiosqlite:// URLs"
        )


def is_postgres(engine_or_connection: AsyncEngine | AsyncConnection) -> bool:
    return engine_or_connection.dialect.name == "postgresql"


def configure_engine(
    engine: AsyncEngine | Engine, *, synchronous: SqliteSynchronous = SQLITE_SYNCHRONOUS
) -> None:
    """Install the SQLite connection hooks (idempotent; nothing to do on Postgres).

    ``synchronous`` applies to the engine's connections from their next
    transaction on; the last adapter configured on an engine decides it.
    """
    if synchronous not in ("NORMAL", "FULL"):
        raise ConfigurationError(
            f"sqlite_synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}"
        )
    if engine.dialect.name != "sqlite":
        return
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    _SYNCHRONOUS[sync_engine.dialect] = synchronous
    if not event.contains(sync_engine, "begin", _sqlite_begin_immediate):
        event.listen(sync_engine, "begin", _sqlite_begin_immediate)


def _sqlite_prepare(dbapi_connection: Any, synchronous: str) -> bool:
    """Configure one connection; False if WAL could not be switched on yet."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode")
        if cursor.fetchone()[0] != "wal":
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                # Switching a new file to WAL needs the database to itself and
                # does not wait for the busy timeout; another connection is using
                # it (possibly switching it right now). WAL is a property of the
                # file, so try again at this connection's next transaction.
                if "locked" not in str(exc):
                    raise
                return False
        # Only under WAL: NORMAL with a rollback journal could corrupt the file
        # on power loss.
        cursor.execute(f"PRAGMA synchronous = {synchronous}")
        return True
    finally:
        cursor.close()


def sqlite_ready(fairy: PoolProxiedConnection, dialect: Dialect) -> bool:
    """Whether this pooled SQLite connection has its engine's settings already."""
    return bool(fairy.info.get(_SQLITE_READY) == _SYNCHRONOUS.get(dialect, SQLITE_SYNCHRONOUS))


def prepare_sqlite(connection: Connection) -> None:
    """Give this SQLite connection the engine's settings, unless it has them."""
    # Prepared lazily rather than on "connect": connections the application
    # pooled before the adapter existed get the same settings.
    fairy = connection.connection
    synchronous = _SYNCHRONOUS.get(connection.dialect, SQLITE_SYNCHRONOUS)
    if fairy.info.get(_SQLITE_READY) != synchronous:
        ready = _sqlite_prepare(fairy.dbapi_connection, synchronous)
        fairy.info[_SQLITE_READY] = synchronous if ready else None


def _sqlite_begin_immediate(connection: Connection) -> None:
    prepare_sqlite(connection)
    if connection.get_execution_options().get(_READ_ONLY):
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def reader(engine: AsyncEngine) -> AsyncEngine:
    """An engine view for statements that only read.

    Postgres: autocommit, so a read is one round trip. SQLite: a deferred
    ``BEGIN``, so readers do not take the write lock.
    """
    if is_postgres(engine):
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine.execution_options(**{_READ_ONLY: True})


def single_writer(engine: AsyncEngine) -> AsyncEngine:
    """An engine view for a write that is one statement.

    Postgres: autocommit (the statement is its own transaction, one round
    trip). SQLite: the engine itself, so the write begins ``IMMEDIATE``.
    """
    if is_postgres(engine):
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def status_by_key(status: ColumnElement[str]) -> ColumnElement[str]:
    """``status`` as a term no index may serve, on every dialect (``status || ''``).

    For a status filter on rows found by primary key. The planner's statistics
    of the status column are stale by nature (an ``ANALYZE`` of a drained
    table saw no running job), so Postgres may read every ``running`` entry of
    the status index, dead ones included, to complete ten jobs it could look up
    by id.
    """
    return status.op("||", return_type=status.type)(literal_column("''"))


async def take_migration_lock(connection: AsyncConnection, name: str) -> None:
    """Serialize migrations of one table set across processes, until commit.

    Postgres: a transaction-scoped advisory lock keyed by ``name``. SQLite: the
    transaction already began with ``BEGIN IMMEDIATE``, which excludes every
    other writer.
    """
    if not is_postgres(connection):
        return
    digest = hashlib.sha256(f"queuert-notify:migrate:{name}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def needs_transaction(exc: BaseException) -> bool:
    """True when a one-statement completion refused to run alone (see
    :meth:`Statements.complete_in_one_statement`): nothing was written."""
    return (
        isinstance(exc, DBAPIError)
        and getattr(exc.orig, "sqlstate", None) == _INVALID_TEXT_REPRESENTATION
        and NEEDS_TRANSACTION in str(exc.orig)
    )


def is_retryable(exc: BaseException) -> bool:
    """True for a deadlock or serialization failure: retrying the transaction is safe."""
    if not isinstance(exc, DBAPIError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return sqlstate in _RETRYABLE_SQLSTATES
