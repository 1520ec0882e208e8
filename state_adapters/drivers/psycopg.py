"""psycopg 3 (sync and asyncio engines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.pq import ExecStatus

_TUPLES_OK = ExecStatus.TUPLES_OK
_CURSORS = "queuert_notify.psycopg_cursors"
"""The key of a connection's kept cursors (by statement) in its pool ``info``."""


class Psycopg:
    """psycopg prepares a statement on the server once it ran ``prepare_threshold``
    times (5 by default) on a connection, and keeps it for the connection's life.

    Statements on the driver connection: psycopg opens a transaction on a connection's
    first statement by itself (unless it is in autocommit), exactly as under SQLAlchemy,
    whose ``begin()`` sends nothing; so a statement sent here joins the transaction
    SQLAlchemy then commits or rolls back. The connection's ``prepare_threshold``
    applies as to any statement. Each statement runs on a cursor of its own, kept in
    the pooled connection's ``info`` (gone with the connection) for its next run; a kept
    cursor holds no rows or arguments between runs."""

    name = "psycopg"
    pooler_connect_args: dict[str, Any] = {"prepare_threshold": None}

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        return _driver(dbapi_connection).prepare_threshold is not None

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        return int(_driver(dbapi_connection).info.backend_pid)

    def leaves_connection_broken(self, error: BaseException) -> bool:
        return False  # the dialect's is_disconnect knows every way it breaks

    async def fetch(
        self, dbapi_connection: Any, sql: str, arguments: Any, kept: dict[Any, Any]
    ) -> Sequence[Any]:
        # One cursor per statement and connection, kept with the connection: a cursor
        # run again keeps its adaptation state (the dumpers of the parameters, the
        # loaders of every result column), which a new cursor looks up again on every
        # statement (about a sixth of a claim's driver CPU).
        cursors = kept.get(_CURSORS)
        if cursors is None:
            cursors = kept[_CURSORS] = {}
        cursor = cursors.get(sql)
        if cursor is None or cursor.closed:
            cursor = cursors[sql] = dbapi_connection.driver_connection.cursor()
        try:
            await cursor.execute(sql, arguments)
            if not _has_rows(cursor):
                return ()
            rows: Sequence[Any] = await cursor.fetchall()
            return rows
        finally:
            _release_result(cursor)

    def fetch_sync(self, dbapi_connection: Any, sql: str, arguments: Any) -> Sequence[Any]:
        cursor = dbapi_connection.execute(sql, arguments)
        if not _has_rows(cursor):
            return ()
        rows: Sequence[Any] = cursor.fetchall()
        return rows


def _release_result(cursor: Any) -> None:
    """Let go of the result ``cursor`` read and the arguments it sent, keeping its
    adaptation state: a kept cursor would otherwise hold its statement's last rows (job
    inputs, outputs) for as long as its connection lives. Private psycopg attributes,
    pinned by tests/test_drivers.py."""
    cursor._reset()
    cursor._tx.set_pgresult(None, set_loaders=False)


def _has_rows(cursor: Any) -> bool:
    """Whether the statement returned rows (zero or more): read from the result's status,
    not from ``cursor.description``, which builds a column object per column on every
    call (a worker's claims and completions run thousands a second)."""
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


def _driver(dbapi_connection: Any) -> Any:
    """The psycopg connection: SQLAlchemy's asyncio adapter wraps it, the sync dialect
    hands it over as it is."""
    return getattr(dbapi_connection, "driver_connection", dbapi_connection)
