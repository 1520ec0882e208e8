"""psycopg2 (sync engines, for ``SyncClient``)."""

from __future__ import annotations

from typing import Any


class Psycopg2:
    """psycopg2 never prepares statements on the server."""

    name = "psycopg2"
    pooler_connect_args: dict[str, Any] = {}

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        return False

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        return int(dbapi_connection.info.backend_pid)
