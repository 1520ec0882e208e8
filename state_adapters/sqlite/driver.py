"""SQLite: each of the adapter's own transactions in one trip to the aiosqlite thread.

aiosqlite runs every call in a thread of its own (one per connection), and each
call is a round trip to that thread (here about 30 µs when the thread is busy and
120 µs when it slept, before any SQL runs). Through SQLAlchemy's asyncio adapter a
statement costs four of them (cursor, execute, fetch, close) and ``BEGIN IMMEDIATE``
three; sent to the aiosqlite connection statement by statement, a transaction still
costs one per statement plus its ``BEGIN IMMEDIATE`` and ``COMMIT`` (three for a
claim, four for a start). Here the whole transaction -- ``BEGIN IMMEDIATE``, the
step's statements, ``COMMIT`` or ``ROLLBACK`` -- is one call into that thread,
through ``Connection._execute``, the function every public method of aiosqlite runs
its call with (private: ``tests/test_sqlite_one_trip.py`` fails if it changes):

- a step is one of the adapter's coroutines that awaits nothing but the
  statements of the :class:`DriverTransaction` it is given, whose ``execute``
  runs the statement on the sqlite3 connection at once and never suspends; so the
  step is driven to its end inside the thread with ``send(None)``, under a copy of
  the caller's context variables;
- a step that would really suspend (awaits anything else) is refused: the
  transaction rolls back and the caller gets ``RuntimeError``. Waiting for the
  event loop from the thread that holds the write lock would stall every writer,
  or deadlock on this very connection;
- the busy timeout is waited in that thread, never on the event loop;
- a caller cancelled meanwhile gets ``CancelledError`` once the call is over (its
  connection cannot be reused before); the transaction rolls back unless it had
  reached ``COMMIT`` by then (as a cancellation during ``COMMIT`` always could).

Steps run in another thread than the event loop: they may touch their transaction,
their own arguments and objects whose updates are single dict or set operations.

What stays as with SQLAlchemy: the statements are the adapter's Core statements,
compiled once with their types' processors
(:class:`~state_adapters.statements.compiled.CompiledStatement`); driver errors are raised as
SQLAlchemy's ``DBAPIError`` (a missing queue table as
:mod:`state_adapters.migrations.missing_tables` says), with ``connection_invalidated`` set and
the connection invalidated when the dialect calls the error a disconnect. What does
not: these statements do not pass through the engine's ``before_cursor_execute`` /
``after_cursor_execute`` events.
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from state_adapters.migrations import missing_tables
from state_adapters.sqlite.connections import prepare_sqlite, sqlite_ready
from state_adapters.statements.compiled import CompiledStatement
from state_adapters.transactions.checkout import pooled_connection

T = TypeVar("T")

Compile = Callable[[Executable], CompiledStatement]
"""The adapter's cache of compiled statements."""

_CLOSED = "no active connection"
"""What aiosqlite says of a closed connection (a disconnect to SQLAlchemy's dialect)."""


class _Rows(list[Any]):
    """Driver rows, read as SQLAlchemy's result is."""

    returns_rows = True

    def all(self) -> list[Any]:
        return self

    def first(self) -> Any:
        return self[0] if self else None


class DriverTransaction:
    """The statements of one ``BEGIN IMMEDIATE`` ... ``COMMIT``, run on the sqlite3
    connection in the aiosqlite thread as they are awaited: :meth:`execute` takes the
    adapter's Core statements (a list of parameter mappings runs the statement once
    per mapping), :meth:`exec_driver_sql` a compiled statement's SQL, as
    ``AsyncConnection`` does. Neither suspends."""

    def __init__(self, sqlite: sqlite3.Connection, trip: _Trip) -> None:
        self._sqlite = sqlite
        self._trip = trip

    async def execute(
        self, statement: Executable, parameters: Mapping[str, Any] | Sequence[Any] | None = None
    ) -> _Rows:
        compiled = self._trip.compile(statement)
        if isinstance(parameters, Sequence):
            arguments = [compiled.arguments(row) for row in parameters]
            self.run(compiled.sql, arguments, many=True)
            return _Rows()
        rows = self.run(compiled.sql, compiled.arguments(parameters or {}))
        return _Rows(compiled.typed(rows))

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> _Rows:
        return _Rows(self.run(statement, parameters))

    def run(self, statement: str, parameters: Any = None, *, many: bool = False) -> list[Any]:
        """Run one statement now (in the aiosqlite thread); its rows."""
        try:
            if many:
                self._sqlite.executemany(statement, parameters)
                return []
            return self._sqlite.execute(statement, parameters or ()).fetchall()
        except sqlite3.Error as exc:
            missing = missing_tables.error(self._trip.dialect, exc)
            if missing is not None:
                raise missing from None
            raise self._trip.wrapped(exc, statement, parameters) from exc


async def run_transaction(
    conn: AsyncConnection, compile: Compile, step: Callable[[DriverTransaction], Awaitable[T]]
) -> T:
    """``step`` in a write transaction (``BEGIN IMMEDIATE``) on the sqlite3 connection
    under ``conn``, in one call to its aiosqlite thread: committed when the step
    returns, rolled back if it raises (or would suspend). ``conn`` must not be in a
    SQLAlchemy transaction."""
    fairy = await pooled_connection(conn)
    if not sqlite_ready(fairy, conn.dialect):
        await conn.run_sync(prepare_sqlite)
    driver: Any = fairy.driver_connection
    assert driver is not None
    trip = _Trip(conn.dialect, fairy.dbapi_connection, compile, step)
    try:
        if not driver._running or driver._connection is None:
            # aiosqlite would refuse with ValueError, which a step could raise too.
            raise trip.wrapped(sqlite3.OperationalError(_CLOSED), "BEGIN IMMEDIATE", None)
        return cast(T, await driver._execute(trip.run, driver))
    except asyncio.CancelledError:
        trip.abandoned = True
        raise
    except BaseException:
        if trip.lost is not None and not conn.invalidated:
            await conn.invalidate(trip.lost.orig)
        raise


class _Trip:
    """One transaction's call into the aiosqlite thread (:meth:`run` runs there)."""

    def __init__(
        self,
        dialect: Dialect,
        dbapi_connection: Any,
        compile: Compile,
        step: Callable[[DriverTransaction], Awaitable[Any]],
    ) -> None:
        self.dialect = dialect
        self.compile = compile
        self._dbapi_connection = dbapi_connection
        self._step = step
        self._context = contextvars.copy_context()
        self.abandoned = False
        """Set by the event loop when the caller stopped waiting: roll back."""
        self.lost: DBAPIError | None = None
        """The disconnect the transaction ran into, if any."""

    def run(self, driver: Any) -> Any:
        sqlite: sqlite3.Connection | None = driver._connection
        if sqlite is None:  # closed since the caller looked
            raise self.wrapped(sqlite3.OperationalError(_CLOSED), "BEGIN IMMEDIATE", None)
        transaction = DriverTransaction(sqlite, self)
        transaction.run("BEGIN IMMEDIATE")
        try:
            result = self._context.run(_drive, self._step, transaction)
            if self.abandoned:
                raise asyncio.CancelledError
            transaction.run("COMMIT")
            return result
        except BaseException:
            if self.lost is None:
                with suppress(sqlite3.Error):
                    sqlite.rollback()
            raise

    def wrapped(self, exc: sqlite3.Error, statement: str, parameters: Any) -> DBAPIError:
        """``exc`` as SQLAlchemy would raise it; a disconnect is noted in :attr:`lost`."""
        disconnect = self.dialect.is_disconnect(exc, self._dbapi_connection, None)  # type: ignore[arg-type]
        wrapped = cast(
            DBAPIError,
            DBAPIError.instance(
                statement,
                parameters,
                exc,
                sqlite3.Error,
                connection_invalidated=disconnect,
                dialect=self.dialect,
            ),
        )
        if disconnect:
            self.lost = wrapped
        return wrapped


def _drive(step: Callable[[DriverTransaction], Awaitable[T]], transaction: DriverTransaction) -> T:
    """Run ``step`` to its end without an event loop; ``RuntimeError`` if it suspends."""
    steps = step(transaction).__await__()
    try:
        awaited = steps.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    close = getattr(steps, "close", None)
    if close is not None:
        close()
    raise RuntimeError(
        f"a SQLite transaction step awaited {awaited!r}: steps run in the driver's thread "
        "and may await only their transaction's statements"
    )
