"""SQLite: a worker's transaction sent straight to the aiosqlite connection.

aiosqlite runs every call in a thread of its own, and each call is a round
trip to that thread (about 0.1 ms of CPU between the two threads here).
Through SQLAlchemy's asyncio adapter a statement costs four of them (cursor,
execute, fetch, close) and ``BEGIN IMMEDIATE`` three: sixteen for a claim
that carries completions, which held a worker to about 2,000 jobs a second.
Sent to the aiosqlite connection under the same pooled SQLAlchemy
connection, the transaction costs one round trip per statement plus its
``BEGIN IMMEDIATE`` and ``COMMIT``.

What stays as with SQLAlchemy: the statements are the adapter's Core
statements, compiled once with their types' processors
(:class:`~state_adapters.compiled.CompiledStatement`); driver errors are raised
as SQLAlchemy's ``DBAPIError``, with ``connection_invalidated`` set and the
connection invalidated when the dialect calls the error a disconnect. What
does not: these statements do not pass through the engine's
``before_cursor_execute`` / ``after_cursor_execute`` events.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from state_adapters import missing_tables
from state_adapters.compiled import CompiledStatement
from state_adapters.sqlite_connections import prepare_sqlite, sqlite_ready

Compile = Callable[[Executable], CompiledStatement]
"""The adapter's cache of compiled statements."""


class _Rows(list[Any]):
    """Driver rows, read as SQLAlchemy's result is."""

    returns_rows = True

    def all(self) -> list[Any]:
        return self

    def first(self) -> Any:
        return self[0] if self else None


class DriverTransaction:
    """The statements of one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the aiosqlite
    connection: :meth:`execute` takes the adapter's Core statements (a list of
    parameter mappings runs the statement once per mapping), :meth:`exec_driver_sql`
    a compiled statement's SQL, as ``AsyncConnection`` does."""

    def __init__(self, conn: AsyncConnection, driver: Any, compile: Compile) -> None:
        self._conn = conn
        self._driver = driver
        self._compile = compile

    async def execute(
        self, statement: Executable, parameters: Mapping[str, Any] | Sequence[Any] | None = None
    ) -> _Rows:
        compiled = self._compile(statement)
        if isinstance(parameters, Sequence):
            arguments = [compiled.arguments(row) for row in parameters]
            await self._call(
                lambda: self._driver.executemany(compiled.sql, arguments), compiled.sql
            )
            return _Rows()
        rows = await self.exec_driver_sql(compiled.sql, compiled.arguments(parameters or {}))
        return _Rows(compiled.typed(rows))

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> _Rows:
        rows = await self._call(
            lambda: self._driver.execute_fetchall(statement, parameters), statement, parameters
        )
        return _Rows(rows)

    async def _call(
        self, call: Callable[[], Awaitable[Any]], statement: str, parameters: Any = None
    ) -> Any:
        try:
            return await call()
        except sqlite3.Error as exc:
            missing = missing_tables.error(self._conn.dialect, exc)
            if missing is not None:
                raise missing from None
            raise await _wrapped(self._conn, exc, statement, parameters) from exc


@asynccontextmanager
async def driver_transaction(
    conn: AsyncConnection, compile: Compile
) -> AsyncIterator[DriverTransaction]:
    """A write transaction (``BEGIN IMMEDIATE``) on the aiosqlite connection under
    ``conn``, committed when the block ends, rolled back if it raises. ``conn`` must
    not be in a SQLAlchemy transaction."""
    fairy = await conn.get_raw_connection()
    if not sqlite_ready(fairy, conn.dialect):
        await conn.run_sync(prepare_sqlite)
    driver = fairy.driver_connection
    assert driver is not None
    transaction = DriverTransaction(conn, driver, compile)
    await transaction.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        yield transaction
        await transaction._call(driver.commit, "COMMIT")
    except BaseException:
        if not conn.invalidated:
            with suppress(Exception):
                await driver.rollback()
        raise


async def _wrapped(
    conn: AsyncConnection, exc: sqlite3.Error, statement: str, parameters: Any
) -> DBAPIError:
    """``exc`` as SQLAlchemy would raise it; a disconnect invalidates ``conn``."""
    dialect = conn.dialect
    fairy = await conn.get_raw_connection()
    disconnect = dialect.is_disconnect(exc, fairy.dbapi_connection, None)  # type: ignore[arg-type]
    if disconnect:
        await conn.invalidate(exc)
    wrapped = DBAPIError.instance(
        statement,
        parameters,
        exc,
        sqlite3.Error,
        connection_invalidated=disconnect,
        dialect=dialect,
    )
    return cast(DBAPIError, wrapped)
