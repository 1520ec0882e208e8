"""SQLite connections the way the queue needs them, set up once per engine through
events on its sync engine:

- every connection gets WAL, a long ``busy_timeout``, ``synchronous`` (``NORMAL``
  by default, see :data:`SQLITE_SYNCHRONOUS`), and the driver's own transaction
  handling switched off (``isolation_level = None``), prepared lazily at its
  first transaction, so connections pooled before the adapter existed get them too;
- ``begin``: every transaction starts with ``BEGIN IMMEDIATE``, so a writer
  takes the write lock up front and waits (up to the busy timeout) instead of
  failing with "database is locked" when it upgrades a read lock later.

These hooks apply to every connection of that engine, including the
application's own sessions: on SQLite all transactions on the engine are
write transactions and run one at a time (readers in other connections are
not blocked, thanks to WAL); a connection marked :data:`READ_ONLY` begins a
deferred transaction instead.
"""

from __future__ import annotations

import sqlite3
import weakref
from typing import Any, Literal

from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from state_adapters.errors import ConfigurationError

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

_SQLITE_READY = "queuert_sqlite_ready"
# Each engine's choice, keyed by its dialect: shared by its execution-option views
# and kept across dispose().
_SYNCHRONOUS: weakref.WeakKeyDictionary[Dialect, SqliteSynchronous] = weakref.WeakKeyDictionary()
READ_ONLY = "queuert_read_only"
"""The execution option that makes a connection's transactions deferred (readers)."""


def configure_engine(
    engine: AsyncEngine | Engine, *, synchronous: SqliteSynchronous = SQLITE_SYNCHRONOUS
) -> None:
    """Install the connection hooks on a SQLite engine (idempotent).

    ``synchronous`` applies to the engine's connections from their next
    transaction on; the last adapter configured on an engine decides it.
    """
    check_synchronous(synchronous)
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    _SYNCHRONOUS[sync_engine.dialect] = synchronous
    if not event.contains(sync_engine, "begin", _sqlite_begin_immediate):
        event.listen(sync_engine, "begin", _sqlite_begin_immediate)


def check_synchronous(synchronous: object) -> None:
    """Raise ``ConfigurationError`` unless ``synchronous`` is ``"NORMAL"`` or ``"FULL"``."""
    if synchronous not in ("NORMAL", "FULL"):
        raise ConfigurationError(
            f"sqlite_synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}"
        )


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
    if connection.get_execution_options().get(READ_ONLY):
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
