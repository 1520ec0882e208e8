"""asyncpg (asyncio engines)."""

from __future__ import annotations

from typing import Any


class Asyncpg:
    """asyncpg keeps named prepared statements in a per-connection cache
    (``statement_cache_size``), and SQLAlchemy's adapter keeps asyncpg's prepared
    statement objects in one of its own (``prepared_statement_cache_size``): either
    reuses a statement in a later transaction."""

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
