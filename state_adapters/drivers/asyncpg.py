"""asyncpg (asyncio engines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Asyncpg:
    """asyncpg keeps named prepared statements in a per-connection cache
    (``statement_cache_size``), and SQLAlchemy's adapter keeps asyncpg's prepared
    statement objects in one of its own (``prepared_statement_cache_size``): either
    reuses a statement in a later transaction.

    Statements on the driver connection: SQLAlchemy's adapter begins its transaction
    lazily, on the first statement it runs itself; a statement sent to asyncpg before
    that would run in autocommit, outside the caller's transaction, and survive its
    rollback. So the adapter's transaction is begun first (under the adapter's lock, as
    its own statements are), and asyncpg's errors are translated by the adapter.
    Private attributes of SQLAlchemy's adapter (``_execute_mutex``, ``_transaction``,
    ``_start_transaction``, ``_handle_exception``): ``tests/test_drivers.py`` fails if
    they change."""

    name = "asyncpg"
    pooler_connect_args: dict[str, Any] = {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
    }

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        # Private attributes: neither library exposes these sizes otherwise.
        asyncpg_cache = dbapi_connection.driver_connection._config.statement_cache_size
        return bool(asyncpg_cache) or dbapi_connection._prepared_statement_cache is not None

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        return int(dbapi_connection.driver_connection.get_server_pid())

    def leaves_connection_broken(self, error: BaseException) -> bool:
        # A backend terminated (pg_terminate_backend, a restart) while the connection
        # was idle sends its FATAL error before closing the socket: asyncpg reads it
        # between statements and waits for a ReadyForQuery that never comes, so the
        # next statement fails with this InternalClientError, not a closed connection.
        message = str(getattr(error, "orig", error))
        return "cannot switch to state" in message and "another operation" in message

    async def fetch(
        self, dbapi_connection: Any, sql: str, arguments: Any, kept: dict[Any, Any]
    ) -> Sequence[Any]:
        async with dbapi_connection._execute_mutex:
            if dbapi_connection._transaction is None:
                await dbapi_connection._start_transaction()  # nothing in autocommit
            try:
                rows: Sequence[Any] = await dbapi_connection.driver_connection.fetch(
                    sql, *arguments
                )
            except Exception as error:
                dbapi_connection._handle_exception(error)  # raises it translated
            return rows
